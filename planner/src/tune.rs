//! `tune`: the fastest configuration that fits — a search over a typed space of plan
//! options, every candidate planned and timed by the same passes as `plan`.
//!
//! **Space** ([`Space`], each point a [`Config`] that maps to `plan` flags):
//! - the HSDP shard-group size (divisors of the world size; the world size is plain FSDP);
//! - micro-batch × gradient accumulation for the global batch (sequences per optimizer step
//!   over all ranks, so `micro_batch · accum · world_size = global_batch`), and under
//!   accumulation which micro-batches reduce their gradients: the last only (FSDP2's
//!   `set_requires_gradient_sync(False)` on the others, their unsharded gradients kept) or
//!   each (`--grad-sync each`, torchtitan's loop: more reduce-scatters, no gradient kept);
//! - prefetch: FSDP2's implicit one-ahead, or explicit (forward 1, backward 2); deeper is
//!   left out: tune's answers in six scenarios (Llama-3-8B on 8, 256 and 512 GPUs, 70B on
//!   64, 1B on 1,024, 405B on 2,048) re-planned with every depth up to forward 3, backward 4
//!   were never more than 0.01% faster (2026-11-27);
//! - `reshard_after_forward` of the blocks: all (FSDP2's default), all but the last
//!   (torchtitan's), none (ZeRO-2-like: no backward all-gathers); and (the space's `keep`,
//!   unless `--no-keep-units`) all but the last r units for every r between
//!   ([`Reshard::Keep`]); on more than one node, to the node (FSDP2's int), with or without
//!   the last kept ([`Reshard::ToNode`], [`Reshard::ToNodeButLast`]). The root's
//!   `reshard_after_forward` stays FSDP2's false: true frees its params after the forward
//!   only to gather them again as the backward starts, nothing made in between — another
//!   all-gather, exposed, and no lower peak — so it is never the better choice;
//! - unit groups: k decoder blocks per FSDP unit (`--unit-group k`, FSDP2's
//!   `fully_shard([block_i, …, block_i+k-1])`: 1/k of the collectives, each k times the
//!   size), k a divisor of the number of blocks ([`group_ladder`]; equal units: a shorter
//!   last group would break the position-free property below);
//! - the embeddings and the LM head as FSDP units of their own (torchtitan's wrapping,
//!   `--policy modules:<embeddings>,<blocks>,<head>`, with any unit group of the blocks) or
//!   the root's, where they are untied; with `--separate-edge-units` either alone too; with
//!   `--norm-head-unit` the final norm in the head's unit too (torchtitan's `fully_shard([norm,
//!   output])`, `<norm>+<head>`) ([`Edges`]);
//! - CPU offload (FSDP2's `CPUOffloadPolicy`, `--offload cpu`) or not, under FSDP or HSDP,
//!   any unit group and reshard choice (resharding to the node too, since 2026-11-28),
//!   syncing the last micro-batch or each (the CLI leaves it out on a profile with no host behind the
//!   device, and the space on a CPU, which has no device memory to relieve; HSDP's since
//!   2026-11-28: a 2-block GPT-2 XL on 4 GPUs fits offloaded under HSDP 2 × 2 by 2 KiB where
//!   no FSDP configuration does — +4% to +19% plans in the benchmark, the same answers);
//! - where the shard group outnumbers a param's dim 0 (MoE experts stacked there, their
//!   router, Llama-3.1-405B's k/v projections past 1,024 ranks) and divides its dim 1, that
//!   param on dim 0 or dim 1 (`--shard-dim`, FSDP2's `shard_placement_fn`; [`Outer::dim1`]);
//! - activation checkpointing per unit: the first `full` units' blocks fully checkpointed,
//!   the next `sac` under op-level selective AC, the rest not checkpointed (a unit group's
//!   blocks alike: FSDP2's group hooks need it) — of the units alike; up to [`MINOR_UNITS`]
//!   units unlike the rest (a dense block among MoE ones: [`Space::minor_units`]) each
//!   none, full or SAC in every combination ([`Config::minor`]).
//!
//! **Cost**: the step time the timeline predicts for the planned schedule (tokens/s/GPU is
//! its inverse); **constraint**: the memory the device needs — the caching allocator's
//! predicted reserved peak plus the CUDA context and NCCL buffers ([`crate::reserved`]) —
//! or, with a stated reserve, the tensor peak plus that reserve, within the limit; and under
//! CPU offload, the node's ranks' host share within the node's host memory
//! ([`crate::memory::HostNeed`]), which no checkpointing, micro-batch or kept-unit choice
//! changes (it is the shards, grads and optimizer state): an outer point fits it whole or not
//! at all, so the properties below hold as they are.
//!
//! **Search** (exact over the space under two monotonicity properties of the model that
//! the tests check by brute force, the kept-unit counts within [`KEEP_TOLERANCE`]):
//! checkpointing one more block, or moving one from
//! op-level SAC to full, never makes the step faster (it adds recompute) and never raises
//! the memory needed. For each outer point (shard group, micro-batch, prefetch, reshard, …):
//! its time with no checkpointing bounds every AC choice from below (outer points are taken
//! in the order of an estimate of their best — that time plus the recompute the memory over
//! the limit calls for, [`estimates`] — and dropped once that bound cannot beat the best
//! found); if everything
//! fully checkpointed does not fit, nothing in it does. Else, where there is a best to beat,
//! a second floor: every configuration that fits checkpoints at least `need` units, the
//! fewest whose tensor peak fits fully checkpointed (a search on tensor peaks), so none is
//! faster than `need` under SAC, nor from `full` units on than those `full` and SAC on the
//! rest of `need` (`lowest`). The walk starts at the least `full` whose every unit
//! checkpointed fits (levels whose tensor peak alone is over the limit skipped by a search
//! on peaks, the rest replayed in order; the outer point dropped there if `lowest` of it
//! cannot beat the best), and for each `full` from there the least `sac` that fits is found
//! by bisection, and the loop stops once `lowest` of `full` cannot beat the best. Which
//! blocks: identical blocks recompute the same wherever they are, and checkpointing the
//! first ones frees their activations' recompute earliest in the backward (the least
//! memory; checked by brute force over every assignment on 4- and 2-block models) — but the
//! recompute's *time* can depend on where: a block whose backward runs beside an all-gather
//! still in flight hides it (2 Llama-3.2-1B blocks on 4 H100s two to a node, the last kept
//! after forward: checkpointing the last is free, the first costs 0.9% of the step;
//! Llama-3-8B on 256 H100s under HSDP 64 × 4: the last block's recompute 0.6% cheaper than
//! the first's). So where one unit checkpointed at the back is faster than at the front,
//! the same walk runs again counted from the back ([`Config::back`]: the last `full` units
//! fully, the `sac` before them under SAC), under the best of both; the oracle test that
//! writes `plan`'s options out by hand finds the 0.9% without it.
//!
//! CPU offload: the outer points without it are searched first, then the offloaded ones
//! under that best, at the shard groups where the host's optimizer step alone (a floor of any
//! offloaded step) does not exceed it ([`search`]); without offload, not at the shard groups
//! where what stays on the device alone is over the limit ([`resident_floor`]).
//!
//! Kept units (`keep`): after the two passes, a third searches the kept counts of each
//! outer point resharding all. A count's best is at least a floor: the floor of a count with
//! fewer kept (resharding all's, the second pass's) less what the more kept save without
//! checkpointing (`search_outer` returns a floor of an outer point's best beside it). Counts
//! are taken from the fewest up, the next being the least whose floor is more than
//! [`KEEP_TOLERANCE`] below the best found; where one needs no checkpointing, the most kept
//! that need none either (bisection) are no slower than any between (ARCHITECTURE.md,
//! property 4).
//!
//! Long accumulations: a configuration of more than [`REPLAY_ACCUM`] micro-batches is timed
//! from a plan of [`SHORT_ACCUM`] and checked against the limit from a plan of
//! [`REPLAY_ACCUM`], where those plans show the long one's figures (exactly:
//! [`crate::plan::Plan::steady`], [`timeline::predict_longer`],
//! [`crate::reserved::needed_within_longer`]), else from its own; what a search shows is
//! planned in full ([`settle`]), with whatever ties with it to within float rounding
//! ([`settle_first`], [`settled_pareto`]).
//!
//! Unit groups are searched along each family of outer points (the same choices but the
//! group) from one block per unit up, larger groups only while they make the step without
//! checkpointing faster (a user's `--unit-groups` list: every one). What that takes: a larger
//! group of equal units needs no less memory (two units' worth of blocks unsharded at once,
//! a larger last unit kept), and its gain is in the collectives (fewer, larger), which
//! checkpointing — more compute beside the same communication — does not enlarge. Not a
//! theorem of the model: the brute-force tests hold it (every divisor, every assignment), and
//! at real sizes 13 scenarios give the answer of the search over every group (Llama-3-8B on
//! 8, 16, 256 and 512 GPUs, under 60 and 40 GiB; Llama-3-70B on 64; Llama-3.1-405B on 2,048;
//! Llama-1B on 64 and 1,024; GPT-2 on 8 and 64; GPT-2 XL on 256), with up to half its plans
//! (Llama-3-8B on 8 GPUs at global batch 32: 897 against 1,750).

use crate::hardware::Hardware;
use crate::options::{AcMode, BackwardPrefetch, Options, Strategy};
use crate::cost::CostModel;
use crate::plan::Plan;
use crate::timeline;
use crate::PlanError;
use fsdp_ir::Model;
use std::collections::HashMap;

/// Which blocks reshard their params after forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reshard {
    /// Every block (FSDP2's default).
    All,
    /// Every block but the last (torchtitan: the backward needs it right away).
    AllButLast,
    /// None: parameters stay gathered from forward to backward (no backward all-gather).
    None,
    /// Every block to a node's GPUs (FSDP2's `reshard_after_forward=<GPUs per node>`): a 1/node
    /// slice kept after forward, the backward all-gather inside the node (FSDP only, more than
    /// one node).
    ToNode,
    /// Every block to a node's GPUs but the last, kept (torchtitan's `last=false` with the
    /// others' `reshard_after_forward=<GPUs per node>`; FSDP only, more than one node).
    ToNodeButLast,
    /// Every unit but the last `r` in forward order (2 ≤ r, fewer than all the units): per
    /// unit `reshard_after_forward=False` from the end, torchtitan's last block taken further
    /// — each kept unit's backward all-gather saved, its params held from forward to backward
    /// ([`search`]'s third pass).
    Keep(u32),
}

impl Reshard {
    pub const ALL: [Reshard; 3] = [Reshard::All, Reshard::AllButLast, Reshard::None];
    pub fn name(self) -> String {
        match self {
            Reshard::All => "all".into(),
            Reshard::AllButLast => "all but last".into(),
            Reshard::None => "none".into(),
            Reshard::ToNode => "to the node".into(),
            Reshard::ToNodeButLast => "to the node but last".into(),
            Reshard::Keep(r) => format!("all but the last {r}"),
        }
    }
}

/// The choices outside the blocks' checkpointing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Outer {
    /// HSDP shard-group size (= the world size: FSDP).
    pub shard: u64,
    pub micro_batch: u64,
    pub accum: u32,
    /// 0: FSDP2's implicit prefetch; else explicit (forward 1, backward this deep).
    pub prefetch: u32,
    pub reshard: Reshard,
    /// Blocks per FSDP unit (`--unit-group`; 1: a unit per block).
    pub group: u32,
    /// Which of the embeddings and the LM head are FSDP units of their own (both:
    /// `--policy modules:<embeddings>,<blocks>,<head>`; torchtitan's wrapping puts the final
    /// norm in the head's, `<norm>+<head>`), the rest the root's.
    pub edges: Edges,
    /// FSDP2's CPUOffloadPolicy (`--offload cpu`): shards, grads and the optimizer on the host.
    pub offload: bool,
    /// Under accumulation, every micro-batch reduce-scatters (`--grad-sync each`, torchtitan's
    /// loop), not only the last (FSDP2's `set_requires_gradient_sync(False)` on the others:
    /// their unsharded gradients kept between micro-batches).
    pub sync_each: bool,
    /// The params its shard group outnumbers on dim 0 sharded on dim 1 (`--shard-dim`,
    /// [`Space::short_dim0`]; only where there are such params and dim 1 divides evenly).
    pub dim1: bool,
}

/// The embeddings and the LM head: FSDP units of their own or the root's, the final norm the
/// root's or in the head's unit as torchtitan wraps it (`fully_shard([model.norm,
/// model.output])`: with the embeddings a unit, the root then gathers and reduces nothing at
/// the step's ends; a unit of its own gathers its few KiB twice more a step for nothing the
/// peak notices — the README's Llama-3-8B answer with `model.norm` a unit: 0.4% slower, 7,537
/// against 7,569 tokens/s/GPU, and 4 MiB more on the device). torchtitan wraps both; either alone is a Pareto point of
/// its own — the embeddings alone need less memory than both where the head's gathered
/// weight meets the peak (Llama-3-8B on 8 H100s, 1 × 8192 × 2 syncing each: 78.05 GiB
/// against 78.60), the head alone gathers it apart from the root's — and on a 2-block
/// Llama-3.2-1B on 4 H100s two to a node answers up to 1.3% faster than either extreme at
/// the same limit (`planner/tests/tune.rs`); searched with `tune --separate-edge-units`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Edges {
    /// Both the root's (FSDP2's `fully_shard(model)` over them: the transformer policy).
    Root,
    /// The embeddings a unit of their own, the head the root's.
    Embeddings,
    /// The head a unit of its own, the embeddings and the final norm the root's.
    Head,
    /// Both units of their own, the final norm the root's.
    Both,
    /// The final norm and the head one unit, the embeddings the root's.
    NormHead,
    /// The embeddings a unit, the final norm and the head another (torchtitan's wrapping:
    /// `fully_shard([model.norm, model.output])`; the root holds no params).
    EmbeddingsNormHead,
}

impl Edges {
    pub const ALL: [Edges; 6] = [Edges::Root, Edges::Embeddings, Edges::Head, Edges::Both, Edges::NormHead, Edges::EmbeddingsNormHead];
    pub fn embeddings(self) -> bool {
        matches!(self, Edges::Embeddings | Edges::Both | Edges::EmbeddingsNormHead)
    }
    pub fn head(self) -> bool {
        matches!(self, Edges::Head | Edges::Both | Edges::NormHead | Edges::EmbeddingsNormHead)
    }
    /// Whether the final norm is in the head's unit.
    pub fn norm(self) -> bool {
        matches!(self, Edges::NormHead | Edges::EmbeddingsNormHead)
    }
    /// The choices a space's edge policy allows: all with a final norm to put in the head's
    /// unit, the first four without.
    pub fn all(edge_policy: &[String]) -> Vec<Edges> {
        Edges::ALL.iter().copied().filter(|e| !e.norm() || edge_policy.len() == 4).collect()
    }
    /// The `modules:` policy from the space's `[embeddings, blocks pattern, head, norm+head]`
    /// ([`Space::edge_policy`]), `None` for the root's (the default policy).
    pub fn policy(self, edge_policy: &[String]) -> Option<Vec<String>> {
        let (embed, blocks, head) = match edge_policy {
            [e, b, h] | [e, b, h, _] => (e, b, h),
            _ => return None,
        };
        let norm_head = edge_policy.get(3).unwrap_or(head);
        match self {
            Edges::Root => None,
            Edges::Embeddings => Some(vec![embed.clone(), blocks.clone()]),
            Edges::Head => Some(vec![blocks.clone(), head.clone()]),
            Edges::Both => Some(vec![embed.clone(), blocks.clone(), head.clone()]),
            Edges::NormHead => Some(vec![blocks.clone(), norm_head.clone()]),
            Edges::EmbeddingsNormHead => Some(vec![embed.clone(), blocks.clone(), norm_head.clone()]),
        }
    }
    /// Units of their own this makes of them.
    pub fn units(self) -> u32 {
        self.embeddings() as u32 + self.head() as u32
    }
}

/// A point of the space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Config {
    pub outer: Outer,
    /// The first `full` blocks fully checkpointed (of the blocks alike: not those of the
    /// minor units, [`Space::minor_units`]) …
    pub full: u32,
    /// … the next `sac` under op-level selective AC.
    pub sac: u32,
    /// Counted from the last block instead: the last `full` fully checkpointed, the `sac`
    /// before them under SAC. Identical blocks recompute the same wherever they are, but
    /// not always in the same time: a block whose backward runs while an all-gather it does
    /// not wait for is still in flight hides its recompute (2 blocks on 4 GPUs two to a node,
    /// the last kept after forward: checkpointing it is free, the first is not) — see
    /// [`search`]'s module doc. (False wherever the blocks are all alike: nothing or every one
    /// checkpointed, one way.)
    pub back: bool,
    /// The minor units' checkpointing ([`Space::minor_units`]), a digit in base 3 per unit
    /// (the first the least significant): 0 none, 1 full, 2 op-level SAC.
    pub minor: u32,
}

impl Config {
    /// The configuration `full` / `sac` of `blocks` alike counted from the front (`back`
    /// false) or the back, `back` cleared where both read the same; the minor units as `minor`.
    pub fn new(outer: Outer, full: u32, sac: u32, back: bool, blocks: u32, minor: u32) -> Config {
        let alike = full + sac == 0 || full >= blocks || (full == 0 && sac >= blocks);
        Config { outer, full, sac, back: back && !alike, minor }
    }
    /// Nothing checkpointed.
    pub fn none(outer: Outer) -> Config {
        Config { outer, full: 0, sac: 0, back: false, minor: 0 }
    }
    /// Every block fully checkpointed (the least memory at an outer point).
    pub fn every_full(space: &Space, outer: Outer) -> Config {
        let minor = space.minor_units(outer.group).len() as u32;
        Config { outer, full: space.blocks.len() as u32, sac: 0, back: false, minor: (0..minor).map(|i| 3u32.pow(i)).sum() }
    }
    /// Per block of `n` (0 none, 1 full, 2 op-level SAC): `full` and `sac` counted over all
    /// `n` blocks (the minor units' choice left out).
    pub fn counted(&self, n: u32) -> Vec<u8> {
        counted_modes(n as usize, self.full as usize, self.sac as usize, self.back)
    }
    /// Whether any block is checkpointed.
    pub fn checkpoints(&self) -> bool {
        self.full + self.sac > 0 || self.minor != 0
    }
}

/// The most minor units searched one by one ([`Space::minor_units`]): their 3^n
/// checkpointing choices multiply the walks of an outer point.
pub const MINOR_UNITS: usize = 3;

/// What is searched.
#[derive(Debug, Clone)]
pub struct Space {
    pub shards: Vec<u64>,
    /// (micro-batch, accumulation) pairs.
    pub batches: Vec<(u64, u32)>,
    pub prefetch: Vec<u32>,
    pub reshard: Vec<Reshard>,
    /// Blocks per unit (unit groups; checkpointing then goes by whole groups), ascending.
    pub groups: Vec<u32>,
    /// Every one of `groups` searched (a user's list), not only while larger groups make the
    /// step without checkpointing faster ([`search`]).
    pub every_group: bool,
    /// GPUs per node (what [`Reshard::ToNode`] reshards to).
    pub node: u64,
    /// The blocks' module paths in forward order.
    pub blocks: Vec<String>,
    /// Whether op-level SAC is a choice (else only full checkpointing).
    pub sac: bool,
    /// The edge-unit choices searched ([`Outer::edges`]): the root's and both units of their
    /// own (the final norm the root's; also in the head's unit with `tune --norm-head-unit`)
    /// where the model's embeddings and head are untied ([`Space::edge_policy`]), else the
    /// root's only; either alone too with `tune --separate-edge-units` (twice the plans — Llama-3-8B
    /// on 8 GPUs at 16 × 8192: 1,035 → 2,061; Llama-3.1-405B on 16,384: 2,166 → 4,247, past
    /// its 10 s — for the same answers in the benchmark's seven scenarios, 2026-11-28); every
    /// one by the CLI's default where they hold [`EDGE_SEARCH_SHARE`] of the params or more.
    pub edges: Vec<Edges>,
    /// The `modules:` policy that makes the embeddings and the head units of their own
    /// (embeddings, a pattern of the blocks, head, and the final norm and head as one unit
    /// where a final norm feeds the head), when the model has them untied.
    pub edge_policy: Option<Vec<String>>,
    /// Whether checkpointing is also counted from the last block ([`Config::back`]) where one
    /// unit checkpointed there is faster than at the front (by default; tests turn it off
    /// to check that it is what finds such answers).
    pub from_back: bool,
    /// Whether the kept-unit counts ([`Reshard::Keep`]) are searched (the third pass of
    /// [`search`]) beside `reshard`, whose `All` and `None` bracket them (by default; `tune
    /// --no-keep-units` leaves them out).
    pub keep: bool,
    /// The offload choices searched ([`Outer::offload`]): `[false, true]` where the options
    /// allow CPU offload (FSDP2 layout on a GPU; float8 linears too), under FSDP or HSDP, any reshard
    /// (what `--offload cpu` plans: `Options::check`).
    pub offload: Vec<bool>,
    /// The gradient-sync choices searched where a step accumulates ([`Outer::sync_each`]):
    /// `[false, true]` where the options allow `--grad-sync each` (FSDP2 layout:
    /// `Options::check`), offloaded or not (offloaded, each micro-batch past the first adds
    /// its grads into the host's on the CPU: [`crate::cost::host_accumulate_s`]).
    pub sync: Vec<bool>,
    /// Params shorter on dim 0 than a shard group can be (MoE experts stacked on dim 0, their
    /// router): `(pattern, dim-0 length, dim-1 length)`, alike params folded
    /// (`model.layers.*.mlp.experts.gate_up_proj`). Where the outer point's shard group
    /// outnumbers the rows and divides dim 1, it is searched with them sharded on dim 1 too
    /// ([`Outer::dim1`], `--shard-dim PATTERN=1`, torchtitan's rule for its experts): FSDP2's
    /// Shard(0) leaves every rank whole rows — 1/8 of Mixtral's experts at any group of 8 or
    /// more — and gathers the padding (Mixtral-8x7B on 64 H100s: 2.64 TiB of collectives a
    /// step against 0.35 TiB, 8.17 s against 1.62 s, and 9.19 GiB more per rank), Shard(1)
    /// copies out through temporaries of the params' size — which can need more at once where
    /// the padding is small (Llama-3.1-405B's k/v projections, 1,024 rows over 2,048 ranks:
    /// everything checkpointed 72.72 GiB against 72.50 on the device, the allocator's
    /// replay), so both are searched; Shard(1) alone where Shard(0) pads every such param
    /// to 4 times its rows or more: its gathered buffers then carry at least 4 times those
    /// params' bytes against Shard(1)'s 2 (the gathered and the temporary) at the copy-out,
    /// and it all-gathers 4 times their bytes (the same 405B at 16,384 ranks, 16 times:
    /// searched both ways, 2,986 plans and 11.4 s for the same answer).
    pub short_dim0: Vec<(String, u64, u64)>,
    /// Each block's kind (the first block of the same ops and params: [`block_kinds`]).
    pub kinds: Vec<u32>,
}

impl Space {
    /// The units of `group` blocks (in forward order) whose blocks are not those of the most
    /// common unit — DeepSeek's first dense blocks among MoE ones, Qwen3-MoE's `mlp_only_layers`
    /// — where there are at most [`MINOR_UNITS`] (else none: the blocks are then taken as
    /// alike). Blocks alike recompute the same wherever they are, so the walk counts them
    /// (`full`, `sac`); a minor unit does not, and its choice is searched on its own
    /// ([`Config::minor`]): every assignment of none / full / SAC to the minor units, each
    /// with its own walk over the rest (brute force over such models holds it,
    /// `planner/tests/tune.rs`).
    pub fn minor_units(&self, group: u32) -> Vec<u32> {
        let k = group.max(1) as usize;
        if self.kinds.len() != self.blocks.len() || self.kinds.is_empty() {
            return vec![];
        }
        // (every block alike, as in most models: nothing to count — nor to collect, per plan)
        if self.kinds.iter().all(|&x| x == self.kinds[0]) {
            return vec![];
        }
        let units: Vec<&[u32]> = self.kinds.chunks(k).collect();
        let mut count: HashMap<&[u32], usize> = HashMap::new();
        for u in &units {
            *count.entry(u).or_default() += 1;
        }
        // (the most common, the first of them where two are as common)
        let most = units.iter().map(|u| count[u]).max().unwrap_or(0);
        let Some(&major) = units.iter().find(|u| count[*u] == most) else { return vec![] };
        let minor: Vec<u32> = (0..units.len()).filter(|&i| units[i] != major).map(|i| i as u32).collect();
        if minor.len() > MINOR_UNITS {
            vec![]
        } else {
            minor
        }
    }
    /// The minor-unit codes searched at unit group `group` ([`Config::minor`]): every
    /// assignment, nothing checkpointed first (only none / full without SAC in the space).
    pub fn minor_codes(&self, group: u32) -> Vec<u32> {
        let m = self.minor_units(group).len() as u32;
        (0..3u32.pow(m)).filter(|&c| self.sac || (0..m).all(|i| (c / 3u32.pow(i)) % 3 != 2)).collect()
    }
    /// The blocks of an outer point's units alike (not the minor units'), in forward order.
    pub fn main_blocks(&self, group: u32) -> usize {
        self.blocks.len() - self.minor_units(group).len() * group.max(1) as usize
    }
}

/// Each block's kind: the index of the first block with the same ops (kinds and shapes, and
/// the module paths within the block) and params (shapes and dtypes).
pub fn block_kinds(model: &Model, blocks: &[String]) -> Vec<u32> {
    let signature = |b: &str| -> String {
        let inside = |m: &str| m == b || m.strip_prefix(b).is_some_and(|r| r.starts_with('.'));
        let mut sig = String::new();
        for op in model.ops.iter().filter(|o| inside(&o.module)) {
            sig.push_str(&format!("{}|{:?}|{:?}|", &op.module[b.len()..], op.kind, op.shape));
            for p in &op.params {
                if let Some(p) = model.param(p) {
                    sig.push_str(&format!("{:?}{:?}{},", p.shape, p.dtype, p.requires_grad));
                }
            }
            sig.push(';');
        }
        sig
    };
    let sigs: Vec<String> = blocks.iter().map(|b| signature(b)).collect();
    sigs.iter().map(|s| sigs.iter().position(|t| t == s).unwrap_or(0) as u32).collect()
}

/// The memory a configuration must fit in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub bytes: u64,
    /// `Some(r)`: the tensor peak plus `r` must fit; `None`: the allocator model's reserved
    /// peak plus the CUDA context and NCCL ([`crate::reserved::Reserved::needed_bytes`]).
    pub reserve: Option<u64>,
}

/// A planned configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Eval {
    pub config: Config,
    pub step_time_s: f64,
    pub tokens_per_s_per_gpu: f64,
    pub mfu: f64,
    pub exposed_comm_s: f64,
    pub peak_bytes: u64,
    /// What the device needs (reserved + context + NCCL, or peak + reserve); `None` when it
    /// is over the limit, not measured to the end: the peak alone already was (the allocator
    /// was not replayed), or the replay passed a limit below the device's memory and stopped;
    /// in a search, also where the node's host cannot hold an offloaded configuration (the
    /// device is then not replayed: `host_over`).
    pub needed_bytes: Option<u64>,
    /// Under CPU offload: what each rank keeps on the host
    /// ([`crate::plan::HostMemory::peak_bytes`]), and whether the node's ranks together
    /// are over the host's memory ([`crate::memory::HostNeed`]; such a configuration does
    /// not fit whatever the device needs).
    pub host_bytes: Option<u64>,
    pub host_over: bool,
    pub fits: bool,
    /// Where the peak is reached.
    pub peak_at: String,
    /// Planned with fewer micro-batches ([`SHORT_ACCUM`]): the exposed communication is not
    /// known (NaN), the op of the peak may be named another's; [`settle`] plans it in full.
    #[serde(skip)]
    pub proxied: bool,
}

/// The search's answer.
#[derive(Debug, Clone)]
pub struct Tuned {
    pub best: Option<Eval>,
    /// The best configuration of each outer point that has one that fits, fastest first.
    pub per_outer: Vec<Eval>,
    /// Every configuration both timed and checked against the limit.
    pub evaluated: Vec<Eval>,
    /// Plans built (probes of the fit alone, bounds of the time alone included).
    pub plans_built: usize,
}

/// The space for `global_batch` sequences per step on `world_size` ranks: shard groups
/// dividing the world size (intra-node sizes and multiples of a node), micro-batches
/// dividing the per-rank batch, both prefetch modes and reshard choices, the model's blocks
/// (the units the transformer policy wraps).
pub fn space(model: &Model, base: &Options, world_size: u64, global_batch: u64, gpus_per_node: u64) -> Result<Space, PlanError> {
    if global_batch == 0 || !global_batch.is_multiple_of(world_size) {
        return Err(crate::error::opt_err("--global-batch", format!("{global_batch} sequences do not split evenly over {world_size} ranks: give a multiple of the world size")));
    }
    let local = global_batch / world_size;
    let batches: Vec<(u64, u32)> = (1..=local).filter(|m| local.is_multiple_of(*m)).map(|m| (m, (local / m) as u32)).collect();
    let node = gpus_per_node.max(1);
    let shards: Vec<u64> = (1..=world_size)
        .filter(|d| world_size.is_multiple_of(*d))
        .filter(|&d| d == world_size || (d >= 2 && (node.is_multiple_of(d) || d.is_multiple_of(node))))
        .collect();
    let probe = crate::plan_unchecked(model, &Options { world_size, batch: 1, checkpoint: vec![], ..base.clone() })?;
    let blocks: Vec<String> = probe.units.iter().filter(|u| !u.is_root()).map(|u| u.module.clone()).collect();
    let mut reshard = Reshard::ALL.to_vec();
    if world_size > node && world_size.is_multiple_of(node) && node > 1 {
        reshard.extend([Reshard::ToNode, Reshard::ToNodeButLast]);
    }
    let edge_policy = edge_policy(model, &blocks);
    let sac = sac_allowed(base, &blocks);
    // (on a GPU only: a CPU run has no device memory to relieve)
    let offload_ok = base.device == crate::options::Device::Cuda && Options { offload: crate::options::Offload::Cpu, world_size, batch: 1, grad_accum: 1, checkpoint: vec![], ..base.clone() }.check().is_ok();
    let offload = if offload_ok { vec![false, true] } else { vec![false] };
    // (the embeddings and the head as units of their own, torchtitan's wrapping, where they
    // are untied: it frees memory for less checkpointing, 0.3–1.4% faster answers on Llama-3)
    // (the final norm the root's; in the head's unit, as torchtitan wraps it, with `tune
    // --norm-head-unit`: 1.43 times the plans over the zoo for answers 0.007–0.22% faster in
    // 30 of its 50 scenarios, the same in the rest, 2026-11-29. Neither placement is always
    // the better one — they allocate in a different order, which the allocator's reserved
    // bytes feel: Qwen3-8B on 8 H100s under 60 GiB, 1 × 8192 × 2, the same tensor peak, 58.76
    // GiB reserved with the norm the root's, 61.08 in the head's unit)
    let edges = if edge_policy.is_some() { vec![Edges::Root, Edges::Both] } else { vec![Edges::Root] };
    let groups = group_ladder(blocks.len() as u32);
    let sync_ok = Options { grad_sync: crate::options::GradSync::Each, world_size, batch: 1, grad_accum: 2, checkpoint: vec![], ..base.clone() }.check().is_ok();
    let sync = if sync_ok { vec![false, true] } else { vec![false] };
    // (alike params folded: every member the same shape)
    let mut short_dim0: Vec<(String, u64, u64)> = vec![];
    let mut shapes: Vec<(String, Vec<u64>)> = vec![];
    for p in model.params.iter().filter(|p| p.shape.len() >= 2 && p.shape[0] < world_size && p.tied_to.is_none()) {
        let pattern = crate::units::index_pattern(&p.name);
        match shapes.iter().find(|(q, _)| *q == pattern) {
            Some((_, sh)) if *sh != p.shape => short_dim0.retain(|(q, _, _)| *q != pattern),
            Some(_) => {}
            None => {
                shapes.push((pattern.clone(), p.shape.clone()));
                short_dim0.push((pattern, p.shape[0], p.shape[1]));
            }
        }
    }
    let kinds = block_kinds(model, &blocks);
    Ok(Space { shards, batches, prefetch: vec![0, 2], reshard, groups, every_group: false, node, blocks, sac, edges, edge_policy, keep: true, offload, sync, from_back: true, short_dim0, kinds })
}

/// Whether the options allow op-level SAC on the blocks (`Options::check`: not float8
/// all-gather under HF's checkpointing).
fn sac_allowed(base: &Options, blocks: &[String]) -> bool {
    blocks.first().is_some_and(|b| Options { checkpoint: vec![format!("{b}=selective-op")], ..base.clone() }.check().is_ok())
}

/// The share of a model's parameters held by its embeddings and LM head where those are
/// untied (0 where tied, or not found): what decides whether every edge choice is searched
/// by default ([`EDGE_SEARCH_SHARE`]).
pub fn edge_share(model: &Model) -> f64 {
    let numel = |names: &[String]| -> u64 { model.params.iter().filter(|p| p.tied_to.is_none() && names.contains(&p.name)).map(|p| p.numel()).sum() };
    let Some((embed, head)) = edge_ops(model) else { return 0.0 };
    let (e, h) = (numel(&embed.params), numel(&head.params));
    let total: u64 = model.params.iter().filter(|p| p.tied_to.is_none()).map(|p| p.numel()).sum();
    if e == 0 || h == 0 || total == 0 {
        return 0.0;
    }
    (e + h) as f64 / total as f64
}

/// The embedding op and the LM head (the last linear before the loss), where the head's
/// weight is its own (a tied one, even with a bias of its own, stays in one unit with the
/// embeddings): what [`edge_share`] and the edge policy read.
fn edge_ops(model: &Model) -> Option<(&fsdp_ir::Op, &fsdp_ir::Op)> {
    use fsdp_ir::OpKind;
    let embed = model.ops.iter().find(|o| matches!(o.kind, OpKind::Embedding))?;
    let loss = model.ops.iter().position(|o| matches!(o.kind, OpKind::CrossEntropy { .. }))?;
    let head = model.ops[..loss].iter().rev().find(|o| matches!(o.kind, OpKind::Linear { .. }))?;
    let head_param = model.params.iter().find(|p| head.params.first() == Some(&p.name))?;
    (head_param.tied_to.is_none()).then_some((embed, head))
}

/// From this share of the params in the embeddings and the head ([`edge_share`]), `tune`'s
/// CLI searches every edge choice by default ([`Edges::all`]: either alone a unit, the final
/// norm in the head's unit), not only both or neither ([`space`]'s). Measured 2026-11-29 (`tune` with and
/// without `--separate-edge-units --norm-head-unit`, Llama-3.2-1B's shape untied at 2 to 48
/// blocks on 4 and 8 H100s, seq 512/2048/8192, the profile's memory and 40 GiB): the full
/// search's answers were up to 0.65% faster at 2–16 blocks (shares 81–35%), ≤ 0.15% at 24
/// (26.5%), ≤ 0.12% at 32 and 48 (21%, 15%); on the zoo's real-size models (shares ≤ 15%)
/// either edge alone ≤ 0.14% (bench/tune_space), the final norm in the head's unit ≤ 0.22%.
/// 30% lies between 35% (0.65%) and 26.5% (0.15%). The full search costs 2–3 times the
/// plans, which the models above the share (small ones) afford.
pub const EDGE_SEARCH_SHARE: f64 = 0.30;

/// `[embeddings, blocks pattern, head, norm+head]`: the embedding's module, the blocks as one
/// `*` pattern (`model.layers.*`), the LM head's module and, where a final norm outside the
/// blocks feeds it, the two as one unit (`model.norm+lm_head`), when the head's weight is its own
/// (a tied one must stay in one unit with the embeddings) and the pattern names exactly
/// the blocks.
fn edge_policy(model: &Model, blocks: &[String]) -> Option<Vec<String>> {
    use fsdp_ir::OpKind;
    let (embed, head) = edge_ops(model)?;
    if embed.module.is_empty() || head.module.is_empty() || embed.module == head.module {
        return None;
    }
    let first = blocks.first()?;
    let pattern = format!("{}.*", first.rsplit_once('.')?.0);
    let matched: Vec<&str> = model.modules.iter().map(|m| m.path.as_str()).filter(|p| crate::wrap::glob_match(&pattern, p)).collect();
    if !(matched.len() == blocks.len() && blocks.iter().all(|b| matched.contains(&b.as_str()))) {
        return None;
    }
    // the final norm (what feeds the head, outside the blocks) in the head's unit, as torchtitan
    // wraps them (`fully_shard([model.norm, model.output])`): the root then holds no params
    // when the embeddings are a unit too (no root all-gather and reduce-scatter at the step's ends)
    let inside = |m: &str| m.is_empty() || blocks.iter().any(|b| m == b || m.strip_prefix(b.as_str()).is_some_and(|x| x.starts_with('.')));
    let norm = head.inputs.first().and_then(|i| model.ops.iter().find(|o| &o.name == i)).filter(|o| {
        // (a module of its own beside the embeddings, the blocks and the head: none inside another)
        let within = |a: &str, b: &str| a == b || a.strip_prefix(b).is_some_and(|x| x.starts_with('.'));
        matches!(o.kind, OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. }) && !inside(&o.module) && [embed.module.as_str(), head.module.as_str()].into_iter().chain(blocks.iter().map(String::as_str)).all(|m| !within(&o.module, m) && !within(m, &o.module))
    });
    let mut out = vec![embed.module.clone(), pattern, head.module.clone()];
    out.extend(norm.map(|n| format!("{}+{}", n.module, head.module)));
    Some(out)
}

/// The plan options of a configuration (on top of `base`: dtypes, optimizer, seq, …).
pub fn options(base: &Options, space: &Space, c: &Config) -> Options {
    let o = &c.outer;
    let mut opts = base.clone();
    opts.strategy = if o.shard == base.world_size { Strategy::FullShard } else { Strategy::HybridShard { shard_size: o.shard } };
    opts.batch = o.micro_batch;
    opts.grad_accum = o.accum;
    (opts.forward_prefetch, opts.backward_prefetch) = match o.prefetch {
        0 => (0, BackwardPrefetch::Implicit),
        k => (1, BackwardPrefetch::Depth(k)),
    };
    opts.reshard_after_forward = Some(o.reshard != Reshard::None);
    opts.unit_reshard = match o.reshard {
        Reshard::AllButLast | Reshard::ToNodeButLast => vec![("last".into(), false)],
        Reshard::Keep(r) => kept_units(space, o, r).into_iter().map(|n| (n, false)).collect(),
        _ => vec![],
    };
    opts.reshard_to = matches!(o.reshard, Reshard::ToNode | Reshard::ToNodeButLast).then_some(space.node);
    opts.ac_mode = AcMode::Full;
    opts.checkpoint = checkpoint_entries_of(&space.blocks, &block_modes(space, c));
    opts.unit_group = o.group.max(1);
    opts.offload = if o.offload { crate::options::Offload::Cpu } else { crate::options::Offload::None };
    opts.grad_sync = if o.sync_each { crate::options::GradSync::Each } else { crate::options::GradSync::Last };
    opts.shard_dims = shard_dims(space, o);
    if let Some(p) = space.edge_policy.as_ref().and_then(|p| o.edges.policy(p)) {
        opts.policy = crate::options::Policy::Modules(p);
    }
    opts
}

/// The `--shard-dim` entries of an outer point ([`Space::short_dim0`]): dim 1 for the params
/// its shard group outnumbers on dim 0 and divides on dim 1 — not with resharding to the
/// node (`--shard-dim` is not modelled with it: Shard(0) there).
pub fn shard_dims(space: &Space, o: &Outer) -> Vec<(String, u32)> {
    if !o.dim1 || matches!(o.reshard, Reshard::ToNode | Reshard::ToNodeButLast) {
        return vec![];
    }
    space.short_dim0.iter().filter(|(_, d0, d1)| o.shard > *d0 && d1.is_multiple_of(o.shard)).map(|(p, _, _)| (p.clone(), 1)).collect()
}

/// `--checkpoint` entries for the first `full` blocks (full) and the next `sac` (op-level
/// SAC) — or, `back`, the last `full` and the `sac` before them — runs of numbered paths
/// written as ranges (`model.layers.{0..7}=full`), in forward order.
pub fn checkpoint_entries(blocks: &[String], full: usize, sac: usize, back: bool) -> Vec<String> {
    checkpoint_entries_of(blocks, &counted_modes(blocks.len(), full, sac, back))
}

/// Per block of `n`: 0 none, 1 full, 2 op-level SAC — the first `full` and the next `sac`,
/// or `back`, the last `full` and the `sac` before them.
fn counted_modes(n: usize, full: usize, sac: usize, back: bool) -> Vec<u8> {
    let full = full.min(n);
    let sac = sac.min(n - full);
    (0..n).map(|j| if back { n - 1 - j } else { j }).map(|p| if p < full { 1 } else if p < full + sac { 2 } else { 0 }).collect()
}

/// Each block's checkpointing under `c` (0 none, 1 full, 2 op-level SAC): the blocks alike
/// counted ([`Config::full`], [`Config::sac`], [`Config::back`]), the minor units' by
/// [`Config::minor`].
pub fn block_modes(space: &Space, c: &Config) -> Vec<u8> {
    let n = space.blocks.len();
    let k = c.outer.group.max(1) as usize;
    let minor = space.minor_units(c.outer.group);
    let main: Vec<usize> = (0..n).filter(|b| !minor.contains(&((b / k) as u32))).collect();
    let counted = counted_modes(main.len(), c.full as usize, c.sac as usize, c.back);
    let mut modes = vec![0u8; n];
    for (&b, &m) in main.iter().zip(&counted) {
        modes[b] = m;
    }
    let mut code = c.minor;
    for &u in &minor {
        let u = u as usize;
        for m in modes.iter_mut().take(((u + 1) * k).min(n)).skip(u * k) {
            *m = (code % 3) as u8;
        }
        code /= 3;
    }
    modes
}

/// `--checkpoint` entries of per-block `modes` ([`block_modes`]): runs of one mode written as
/// ranges (`model.layers.{0..7}=full`), in forward order.
pub fn checkpoint_entries_of(blocks: &[String], modes: &[u8]) -> Vec<String> {
    let mut out = vec![];
    let mut i = 0;
    while i < blocks.len().min(modes.len()) {
        let mut j = i + 1;
        while j < blocks.len().min(modes.len()) && modes[j] == modes[i] {
            j += 1;
        }
        let mode = match modes[i] {
            1 => Some("full"),
            2 => Some("selective-op"),
            _ => None,
        };
        if let Some(mode) = mode {
            out.extend(ranges(&blocks[i..j]).into_iter().map(|r| format!("{r}={mode}")));
        }
        i = j;
    }
    out
}

/// Module paths with runs of numbered ones written as ranges (`model.layers.{0..7}`).
fn ranges(paths: &[String]) -> Vec<String> {
    let mut out = vec![];
    let mut i = 0;
    while i < paths.len() {
        // a run of `prefix{n}`, `prefix{n+1}`, …
        let split = |p: &str| p.rfind('.').and_then(|d| p[d + 1..].parse::<u64>().ok().map(|n| (p[..d + 1].to_string(), n)));
        let mut j = i + 1;
        if let Some((pre, n)) = split(&paths[i]) {
            while j < paths.len() && split(&paths[j]) == Some((pre.clone(), n + (j - i) as u64)) {
                j += 1;
            }
            if j - i > 1 {
                out.push(format!("{pre}{{{n}..{}}}", n + (j - i - 1) as u64));
                i = j;
                continue;
            }
        }
        out.push(paths[i].clone());
        i += 1;
    }
    out
}

/// The FSDP units of an outer point other than the root: the embeddings' and the head's
/// when they are units of their own, and the blocks' (`group` per unit).
pub fn units_of(space: &Space, o: &Outer) -> u32 {
    let l = (space.blocks.len() as u32).div_ceil(o.group.max(1));
    l + if space.edge_policy.is_some() { o.edges.units() } else { 0 }
}

/// The `--unit-reshard` names of the last `r` units in forward order (the head's, then the
/// last blocks' as ranges; a group's blocks name it).
pub fn kept_units(space: &Space, o: &Outer, r: u32) -> Vec<String> {
    let mut out = vec![];
    let mut r = r as usize;
    if let (true, Some(head)) = (o.edges.head(), space.edge_policy.as_ref().and_then(|p| p.get(2))) {
        // (`model.norm+lm_head` too: a unit of several modules is named by any of them)
        out.push(head.clone());
        r = r.saturating_sub(1);
    }
    let k = o.group.max(1) as usize;
    let n = space.blocks.len();
    let first = n.saturating_sub(r * k);
    out.extend(ranges(&space.blocks[first..]));
    out
}

/// The `plan` flags of a configuration (what differs from `plan`'s defaults among the
/// options tune decides; the caller adds the fixed ones: dtypes, seq, optimizer, hardware).
pub fn flags(space: &Space, base: &Options, c: &Config) -> Vec<String> {
    let o = &c.outer;
    let mut f = vec!["--world-size".into(), base.world_size.to_string(), "--batch".into(), o.micro_batch.to_string()];
    if o.accum > 1 {
        f.extend(["--grad-accum".into(), o.accum.to_string()]);
        if o.sync_each {
            f.extend(["--grad-sync".into(), "each".into()]);
        }
    }
    if o.shard != base.world_size {
        f.extend(["--strategy".into(), "hybrid-shard".into(), "--shard-group-size".into(), o.shard.to_string()]);
    }
    if o.prefetch > 0 {
        f.extend(["--forward-prefetch".into(), "1".into(), "--backward-prefetch".into(), o.prefetch.to_string()]);
    }
    match o.reshard {
        Reshard::All => {}
        Reshard::AllButLast => f.extend(["--unit-reshard".into(), "last=false".into()]),
        Reshard::None => f.extend(["--reshard-after-forward".into(), "false".into()]),
        Reshard::ToNode => f.extend(["--reshard-after-forward".into(), space.node.to_string()]),
        Reshard::ToNodeButLast => f.extend(["--reshard-after-forward".into(), space.node.to_string(), "--unit-reshard".into(), "last=false".into()]),
        Reshard::Keep(r) => {
            for n in kept_units(space, o, r) {
                f.extend(["--unit-reshard".into(), format!("{n}=false")]);
            }
        }
    }
    if o.group > 1 {
        f.extend(["--unit-group".into(), o.group.to_string()]);
    }
    if let Some(p) = space.edge_policy.as_ref().and_then(|p| o.edges.policy(p)) {
        f.extend(["--policy".into(), format!("modules:{}", p.join(","))]);
    }
    if o.offload {
        f.extend(["--offload".into(), "cpu".into()]);
    }
    for (p, d) in shard_dims(space, o) {
        f.extend(["--shard-dim".into(), format!("{p}={d}")]);
    }
    for e in checkpoint_entries_of(&space.blocks, &block_modes(space, c)) {
        f.extend(["--checkpoint".into(), e]);
    }
    f
}

/// What is known of a configuration so far: its time, its memory, or both.
#[derive(Debug, Clone, Default)]
struct Known {
    time: Option<(f64, f64, f64, f64)>,
    memory: Option<(u64, Option<u64>, String)>,
    /// The tensor peak alone and where it is (known whenever the configuration was planned).
    peak: Option<(u64, String)>,
    /// What each rank keeps on the host under CPU offload (known with `peak`).
    host: Option<u64>,
    refused: bool,
    /// Something known from a shorter accumulation's plan ([`SHORT_ACCUM`]): the same step
    /// time and memory, but for the exposed communication (not known: NaN) and the op the
    /// peak names ([`settle`] plans it in full).
    proxied: bool,
}

/// A configuration accumulating more than [`REPLAY_ACCUM`] micro-batches is timed (and its
/// tensor peak taken) from a plan of this many, where that plan shows what the longer one
/// predicts — its builder's steady state ([`crate::plan::Plan::steady`]: the longer plan is
/// it with its second-to-last micro-batch repeated; the fewest it is shown with: the last
/// three micro-batches start alike), the same tensor peak (the live buffers where each
/// repeated micro-batch starts are the same) and the step time
/// ([`timeline::predict_longer`]) — and in full where it does not. A plan costs about its
/// micro-batches.
pub const SHORT_ACCUM: u32 = 6;

/// A configuration accumulating more micro-batches than this is checked against the limit
/// from a plan of this many, where it shows the longer one's caching-allocator need
/// ([`crate::reserved::needed_within_longer`]; the replay's state must repeat within it: 12
/// is what the tests' cases take at most, `planner/tests/accum.rs`), else in full.
pub const REPLAY_ACCUM: u32 = 12;

/// Whether the node's host holds `host` bytes (per rank, under CPU offload) for each of the
/// node's ranks.
fn host_fits(hw: &Hardware, world_size: u64, host: Option<u64>) -> bool {
    host.is_none_or(|h| crate::memory::HostNeed::of(h, world_size, hw).fits())
}

/// Plans, times and checks configurations lazily — the time (plan + timeline) and the fit
/// (plan + allocator replay) each once — keeping the last plan for the other half.
pub struct Evaluator<'a> {
    pub model: &'a Model,
    pub base: &'a Options,
    pub hw: &'a Hardware,
    pub space: &'a Space,
    pub limit: Limit,
    known: HashMap<Config, Known>,
    order: Vec<Config>,
    /// The last few plans (most recent last): a probe's time and fit come from one plan.
    recent: Vec<(Config, Plan)>,
    planned: usize,
    /// The cost models made, by micro-batch and whether anything is checkpointed (the
    /// forward's cached ops differ): what they read of a configuration.
    costs: Vec<((u64, bool), CostModel)>,
    /// The schedule preludes made ([`crate::schedule::Prelude`]), by micro-batch, the units
    /// (the embeddings and head their own, blocks per unit) and whether anything is
    /// checkpointed: what they read of a configuration.
    preludes: Vec<((u64, Edges, u32, bool), crate::schedule::Prelude)>,
    /// The units prepared ([`crate::prepare`]; `None`: refused), by [`units_key`]: the outer
    /// points that share it differ only in what the passes after the units read (an outer
    /// point's configurations, only in the blocks they checkpoint) — this one's or another
    /// evaluator's ([`Evaluator::seed`]).
    prepared: HashMap<Outer, Units>,
    /// Every plan with its own accumulation (no [`SHORT_ACCUM`] plan): [`settle`]'s.
    pub exact: bool,
}

/// Plans kept by an [`Evaluator`].
const RECENT: usize = 4;

/// An outer point's units, shared ([`crate::prepare`]; `None`: refused).
type Units = Option<std::sync::Arc<crate::Prepared>>;

/// What of an outer point its units depend on ([`crate::prepare`]: the wrapping and unit
/// groups, the shard group's layout and dims, the reshard choices): the rest set to one value.
pub fn units_key(o: Outer) -> Outer {
    Outer { micro_batch: 0, accum: 0, prefetch: 0, offload: false, sync_each: false, ..o }
}

impl<'a> Evaluator<'a> {
    pub fn new(model: &'a Model, base: &'a Options, hw: &'a Hardware, space: &'a Space, limit: Limit) -> Self {
        Evaluator { model, base, hw, space, limit, known: HashMap::new(), order: vec![], recent: vec![], planned: 0, costs: vec![], preludes: vec![], prepared: HashMap::new(), exact: false }
    }

    /// How many plans were built.
    pub fn planned(&self) -> usize {
        self.planned
    }

    /// `c`'s plan, or where it accumulates more than [`SHORT_ACCUM`] micro-batches, maybe a
    /// shorter accumulation's ([`Evaluator::plan_of`]).
    fn plan(&mut self, c: Config) -> Option<&Plan> {
        self.plan_of(c, SHORT_ACCUM)
    }

    /// Whether `plan` (of `c`) is a shorter accumulation's.
    fn shorter(c: Config, plan: &Plan) -> bool {
        plan.options.grad_accum < c.outer.accum
    }

    /// `c`'s plan, or one of at least `least` of its micro-batches (if fewer than `c`'s: one
    /// whose builder reached a steady state, else `c`'s own): one planned already, or
    /// `least`'s (`u32::MAX`: `c`'s own).
    fn plan_of(&mut self, c: Config, least: u32) -> Option<&Plan> {
        // (accumulations of up to REPLAY_ACCUM micro-batches are planned in full: a shorter
        // plan for the time and the full one for the memory would cost more)
        let least = if self.exact || c.outer.accum <= REPLAY_ACCUM { u32::MAX } else { least }.min(c.outer.accum);
        match self.recent.iter().position(|(rc, p)| *rc == c && p.options.grad_accum >= least) {
            Some(i) => {
                let hit = self.recent.remove(i);
                self.recent.push(hit);
            }
            None => {
                self.planned += 1;
                let mut opts = options(self.base, self.space, &c);
                opts.grad_accum = least;
                let model = self.model;
                let prep = self.prepared.entry(units_key(c.outer)).or_insert_with(|| crate::prepare(model, &opts).ok().map(std::sync::Arc::new)).clone();
                // (units the planner refuses refuse every configuration of the outer point)
                let planned = match prep {
                    Some(prep) => {
                        let o = &c.outer;
                        let key = (o.micro_batch, o.edges, o.group, !c.checkpoints());
                        let at = match self.preludes.iter().position(|(k, _)| *k == key) {
                            Some(i) => i,
                            None => {
                                self.preludes.push((key, crate::schedule::Prelude::new(self.model, &opts, &prep.units, prep.attn)));
                                self.preludes.len() - 1
                            }
                        };
                        let pre = &self.preludes[at].1;
                        match crate::plan_prepared_with(self.model, &opts, &prep, pre).ok() {
                            // (a shorter plan that shows nothing of the longer: the longer)
                            Some(p) if !p.steady && Self::shorter(c, &p) => {
                                self.planned += 1;
                                opts.grad_accum = c.outer.accum;
                                crate::plan_prepared_with(self.model, &opts, &prep, pre).ok()
                            }
                            p => p,
                        }
                    }
                    _ => None,
                };
                match planned {
                    Some(p) => {
                        if self.recent.len() == RECENT {
                            self.recent.remove(0);
                        }
                        let shorter = Self::shorter(c, &p);
                        let k = self.entry(c);
                        if k.peak.is_none() || !shorter {
                            k.peak = Some((p.memory.peak_bytes, p.memory.peak_at.clone()));
                            k.proxied |= shorter;
                        }
                        k.host = p.memory.host.as_ref().map(|h| h.peak_bytes);
                        self.recent.push((c, p));
                    }
                    None => {
                        self.known.entry(c).or_default().refused = true;
                        return None;
                    }
                }
            }
        }
        self.recent.last().map(|(_, p)| p)
    }

    /// What another evaluator learnt of `c` (the search's first pass times each outer point),
    /// and the units it prepared for `c`'s outer point, if any.
    fn seed(&mut self, c: Config, k: Known, prep: Option<Units>) {
        *self.entry(c) = k;
        if let Some(p) = prep {
            self.prepared.insert(units_key(c.outer), p);
        }
    }

    /// The units prepared for `o` (`None`: none were).
    fn prepared(&self, o: Outer) -> Option<Units> {
        self.prepared.get(&units_key(o)).cloned()
    }

    fn entry(&mut self, c: Config) -> &mut Known {
        if !self.known.contains_key(&c) {
            self.order.push(c);
        }
        self.known.entry(c).or_default()
    }

    /// The predicted step time (`None`: the planner refuses the configuration).
    pub fn time(&mut self, c: Config) -> Option<f64> {
        if let Some(k) = self.known.get(&c) {
            if k.refused {
                return None;
            }
            if let Some(t) = k.time {
                return Some(t.0);
            }
        }
        let (model, hw) = (self.model, self.hw);
        let key = (c.outer.micro_batch, !c.checkpoints());
        let mut costs = std::mem::take(&mut self.costs);
        let cost_of = |costs: &mut Vec<((u64, bool), CostModel)>, plan: &Plan| match costs.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                costs.push((key, CostModel::new(plan, model)));
                costs.len() - 1
            }
        };
        let mut timed = None;
        if let Some(plan) = self.plan(c).filter(|p| Self::shorter(c, p)) {
            let at = cost_of(&mut costs, plan);
            let cm = &costs[at].1;
            timed = timeline::predict_longer(plan, hw, cm, c.outer.accum).map(|step| {
                // (as the plan's own report: tokens and model FLOPs of every micro-batch)
                let n = f64::from(c.outer.accum);
                let tokens = (plan.options.batch * plan.options.seq) as f64 * n;
                (step, tokens / step, cm.model_flops * n / (step * hw.peak_flops.bf16), f64::NAN)
            });
        }
        let t = match timed {
            Some(t) => {
                self.entry(c).proxied = true;
                Some(t)
            }
            None => self.plan_of(c, u32::MAX).map(|plan| {
                let at = cost_of(&mut costs, plan);
                let t = timeline::predict_with(plan, hw, &costs[at].1);
                (t.step_time_s, t.tokens_per_s_per_gpu, t.mfu, t.exposed_comm_s)
            }),
        };
        self.costs = costs;
        let t = t?;
        self.entry(c).time = Some(t);
        Some(t.0)
    }

    /// Whether it fits the limit (and under CPU offload, the node's host).
    pub fn fits(&mut self, c: Config) -> bool {
        let ws = self.base.world_size;
        if let Some(k) = self.known.get(&c) {
            if k.refused {
                return false;
            }
            if !host_fits(self.hw, ws, k.host) {
                // (no device need makes up for it: the allocator is not replayed)
                if k.memory.is_none() {
                    let (peak, at) = k.peak.clone().unwrap_or_default();
                    self.entry(c).memory = Some((peak, None, at));
                }
                return false;
            }
            if let Some((_, needed, _)) = &k.memory {
                return needed.is_some_and(|n| n <= self.limit.bytes);
            }
            // what the tensor peak decides needs no plan (the search's first pass planned
            // every outer point's first configuration on another thread)
            if let Some((peak, at)) = &k.peak {
                if let Some(needed) = needed_by_peak(*peak, self.base.device, self.limit) {
                    let m = (*peak, needed, at.clone());
                    self.entry(c).memory = Some(m);
                    return needed.is_some_and(|n| n <= self.limit.bytes);
                }
            }
        }
        let (hw, limit) = (self.hw, self.limit);
        let Some(plan) = self.plan_of(c, REPLAY_ACCUM) else { return false };
        let shorter = Self::shorter(c, plan);
        if !host_fits(hw, ws, plan.memory.host.as_ref().map(|h| h.peak_bytes)) {
            let m = (plan.memory.peak_bytes, None, plan.memory.peak_at.clone());
            let k = self.entry(c);
            k.memory = Some(m);
            k.proxied |= shorter;
            return false;
        }
        // (what passes a limit below the device's memory is not replayed to the end: `None`,
        // as for a peak over it)
        let by_peak = needed_by_peak(plan.memory.peak_bytes, plan.options.device, limit);
        let known = match by_peak {
            Some(n) => Some((n, plan)),
            None if shorter => crate::reserved::needed_within_longer(plan, hw, limit.bytes, c.outer.accum).map(|n| (n, plan)),
            None => Some((crate::reserved::needed_within(plan, hw, limit.bytes), plan)),
        };
        let (needed, peak, at, shorter) = match known {
            Some((n, p)) => (n, p.memory.peak_bytes, p.memory.peak_at.clone(), shorter),
            None => {
                let Some(plan) = self.plan_of(c, u32::MAX) else { return false };
                (crate::reserved::needed_within(plan, hw, limit.bytes), plan.memory.peak_bytes, plan.memory.peak_at.clone(), false)
            }
        };
        let k = self.entry(c);
        k.memory = Some((peak, needed, at));
        k.proxied |= shorter;
        needed.is_some_and(|n| n <= limit.bytes)
    }

    /// Whether `c` (planned) is offloaded past what the node's host holds.
    fn host_over(&self, c: Config) -> bool {
        self.known.get(&c).is_some_and(|k| !host_fits(self.hw, self.base.world_size, k.host))
    }

    /// The tensor peak (a plan, no allocator replay; `None`: refused).
    pub fn peak(&mut self, c: Config) -> Option<u64> {
        if let Some(k) = self.known.get(&c) {
            if k.refused {
                return None;
            }
            if let Some((p, _)) = k.peak {
                return Some(p);
            }
        }
        self.plan(c).map(|p| p.memory.peak_bytes)
    }

    /// The floor of what the device needs ([`floor_bytes`]) from the tensor peak: a plan, no
    /// allocator replay (`None`: refused); what is over the limit by it does not fit.
    fn floor(&mut self, c: Config) -> Option<u64> {
        let (device, limit) = (self.base.device, self.limit);
        self.peak(c).map(|p| floor_bytes(p, device, limit))
    }

    /// The largest unit's params as all-gathered (a plan; 0 where refused): what keeping one
    /// more unit can lower the tensor peak by at most ([`search_kept`]).
    fn unit_bytes(&mut self, c: Config) -> u64 {
        let Some(plan) = self.plan(c) else { return 0 };
        plan.units.iter().filter(|u| !u.is_root()).map(|u| crate::cost::unsharded_bytes(u, &plan.options)).max().unwrap_or(0)
    }

    /// What the device needs beyond the tensor peak at a configuration already checked by
    /// [`Evaluator::fits`] (the allocator's fragmentation, the CUDA context, NCCL).
    fn overhead(&self, c: Config) -> Option<u64> {
        let k = self.known.get(&c)?;
        let (peak, needed, _) = k.memory.as_ref()?;
        needed.map(|n| n.saturating_sub(*peak))
    }

    /// Time and memory (planning what is missing).
    pub fn eval(&mut self, c: Config) -> Option<Eval> {
        self.time(c)?;
        self.fits(c);
        self.known_eval(c)
    }

    fn known_eval(&self, c: Config) -> Option<Eval> {
        let k = self.known.get(&c)?;
        let (step_time_s, tokens_per_s_per_gpu, mfu, exposed_comm_s) = k.time?;
        let (peak_bytes, needed_bytes, peak_at) = k.memory.clone()?;
        let host_over = !host_fits(self.hw, self.base.world_size, k.host);
        let fits = needed_bytes.is_some_and(|n| n <= self.limit.bytes) && !host_over;
        Some(Eval { config: c, step_time_s, tokens_per_s_per_gpu, mfu, exposed_comm_s, peak_bytes, needed_bytes, host_bytes: k.host, host_over, fits, peak_at, proxied: k.proxied })
    }

    /// Every configuration both timed and checked.
    pub fn evaluated(&self) -> Vec<Eval> {
        self.order.iter().filter_map(|c| self.known_eval(*c)).collect()
    }
}

/// What the device needs for `plan` under `limit`'s rule; `None` when the tensor peak alone
/// (a floor of the reserved memory) is already over the limit.
fn needed_bytes(plan: &Plan, hw: &Hardware, limit: Limit) -> Option<u64> {
    needed_by_peak(plan.memory.peak_bytes, plan.options.device, limit).unwrap_or_else(|| Some(crate::reserved::predict(plan, hw).needed_bytes(plan)))
}

/// [`needed_bytes`] where the tensor peak alone decides it: the peak plus the stated reserve,
/// or `Some(None)` on a GPU whose peak and CUDA context are already over the limit; `None`
/// where it takes the allocator replay.
fn needed_by_peak(peak: u64, device: crate::options::Device, limit: Limit) -> Option<Option<u64>> {
    match limit.reserve {
        Some(r) => Some(Some(peak.saturating_add(r))),
        None if device == crate::options::Device::Cuda && floor_bytes(peak, device, limit) > limit.bytes => Some(None),
        None => None,
    }
}

/// The least the device needs for a tensor peak of `peak` under `limit`'s rule: the peak
/// plus the stated reserve, or on a GPU plus the CUDA context (the caching allocator's
/// reserved memory is never below the tensors it holds; on the CPU the peak is the need).
fn floor_bytes(peak: u64, device: crate::options::Device, limit: Limit) -> u64 {
    match (limit.reserve, device) {
        (Some(r), _) => peak.saturating_add(r),
        (None, crate::options::Device::Cuda) => peak.saturating_add(crate::reserved::CUDA_CONTEXT_BYTES),
        (None, crate::options::Device::Cpu) => peak,
    }
}

/// A floor of the tensor peak of every configuration that keeps the shards on the device,
/// at shard group `shard`: one rank's share of the params, of their grads and of the
/// optimizer's state (Adam's two moments), all alive at the optimizer step — rank 0's shards
/// (the plan's) hold at least the average; the float params in `--master-dtype` where it is
/// set, as the passes plan them (`recast`). What [`crate::memory::host`] counts on
/// the host under offload; `planner/tests/tune.rs` holds plans' peaks at or above it.
pub fn resident_floor(model: &Model, base: &Options, shard: u64) -> u64 {
    let states = if base.optimizer.keeps_state() { 2 } else { 0 };
    let per_elem = |p: &fsdp_ir::Param| {
        let b = base.master_dtype.filter(|_| p.dtype.is_float()).unwrap_or(p.dtype).size();
        if p.requires_grad { b * (2 + states) } else { b }
    };
    let total: u128 = model.params.iter().filter(|p| p.tied_to.is_none()).map(|p| u128::from(p.numel()) * u128::from(per_elem(p))).sum();
    u64::try_from(total / u128::from(shard.max(1))).unwrap_or(u64::MAX)
}

/// Time and memory of a planned configuration against the limit.
pub fn evaluate(plan: &Plan, model: &Model, hw: &Hardware, limit: Limit, config: Config) -> Eval {
    let t = timeline::predict(plan, model, hw);
    let needed = needed_bytes(plan, hw, limit);
    let host_bytes = plan.memory.host.as_ref().map(|h| h.peak_bytes);
    let host_over = !host_fits(hw, plan.options.world_size, host_bytes);
    Eval {
        config,
        step_time_s: t.step_time_s,
        tokens_per_s_per_gpu: t.tokens_per_s_per_gpu,
        mfu: t.mfu,
        exposed_comm_s: t.exposed_comm_s,
        peak_bytes: plan.memory.peak_bytes,
        needed_bytes: needed,
        host_bytes,
        host_over,
        fits: needed.is_some_and(|n| n <= limit.bytes) && !host_over,
        peak_at: plan.memory.peak_at.clone(),
        proxied: false,
    }
}

/// Plans in full the evaluations planned with fewer micro-batches ([`SHORT_ACCUM`]), as a
/// search evaluates a configuration (the same step time and memory, the exposed
/// communication and the peak's op now known): what a search's answer shows. The plans
/// built.
pub fn settle(model: &Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit, evals: Vec<&mut Eval>) -> usize {
    let recast = crate::recast(model, base);
    let model = recast.as_ref().unwrap_or(model);
    let mut todo: Vec<&mut Eval> = evals.into_iter().filter(|e| e.proxied).collect();
    // (each configuration once, on two threads)
    let mut configs: Vec<Config> = todo.iter().map(|e| e.config).collect();
    configs.sort();
    configs.dedup();
    let (a, b) = configs.split_at(configs.len().div_ceil(2));
    let (done, planned) = std::thread::scope(|s| {
        let run = |part: &[Config]| {
            crate::schedule::without_names(|| {
                let mut ev = Evaluator::new(model, base, hw, space, limit);
                ev.exact = true;
                let done: Vec<Eval> = part.iter().filter_map(|&c| ev.eval(c)).collect();
                (done, ev.planned())
            })
        };
        let other = s.spawn(move || run(b));
        let (mut done, planned) = run(a);
        let (more, more_planned) = other.join().unwrap_or_default();
        done.extend(more);
        (done, planned + more_planned)
    });
    for e in todo.iter_mut() {
        if let Some(x) = done.iter().find(|x| x.config == e.config) {
            **e = x.clone();
        }
    }
    planned
}

/// Configurations in the space: per outer point, every (full, SAC) split of its units'
/// blocks (groups of `group` blocks checkpointed alike), counted from the front and, where
/// the space has it, from the back.
pub fn size(space: &Space) -> u64 {
    outers(space)
        .iter()
        .chain(keep_outers(space).iter())
        .map(|o| {
            let l = (space.main_blocks(o.group) as u64).div_ceil(o.group.max(1) as u64);
            let front = if space.sac { (l + 1) * (l + 2) / 2 } else { l + 1 };
            // (counted from the back too: all but nothing, every unit full and every unit
            // under SAC, which read the same both ways)
            let alike = if space.sac { 3 } else { 2 };
            // (times every choice of the minor units)
            (front + if space.from_back && l >= 2 { front - alike } else { 0 }) * space.minor_codes(o.group).len() as u64
        })
        .sum()
}

/// The outer points of the space.
pub fn outers(space: &Space) -> Vec<Outer> {
    let mut v = vec![];
    for &shard in &space.shards {
        for &(micro_batch, accum) in &space.batches {
            for &prefetch in &space.prefetch {
                // (a post-forward group is FSDP2 full-shard's: not under HSDP)
                let fsdp = space.shards.iter().max() == Some(&shard);
                let to_node = |r: Reshard| matches!(r, Reshard::ToNode | Reshard::ToNodeButLast);
                for &reshard in space.reshard.iter().filter(|&&r| !to_node(r) || fsdp) {
                    for &group in &space.groups {
                        // (the choices the model's edge policy makes: the norm's only where
                        // a final norm feeds the head)
                        for &edges in space.edges.iter().filter(|&&e| e == Edges::Root || space.edge_policy.as_deref().is_some_and(|p| Edges::all(p).contains(&e))) {
                            for &offload in &space.offload {
                                // (a step of one micro-batch syncs it either way)
                                let syncs: Vec<bool> = if accum == 1 { vec![false] } else { space.sync.clone() };
                                for sync_each in syncs {
                                    let o = Outer { shard, micro_batch, accum, prefetch, reshard, group, edges, offload, sync_each, dim1: false };
                                    // (Shard(1) where it applies: both searched, or Shard(1)
                                    // alone where Shard(0) pads those params 4 times over)
                                    let d1 = Outer { dim1: true, ..o };
                                    let dims = shard_dims(space, &d1);
                                    if dims.is_empty() || dims.iter().any(|(p, _)| space.short_dim0.iter().any(|(q, d0, _)| q == p && d0.div_ceil(shard) * shard < 4 * d0)) {
                                        v.push(o);
                                    }
                                    if !dims.is_empty() {
                                        v.push(d1);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

/// The outer points keeping their last units after forward ([`Reshard::Keep`], 2 ≤ r < the
/// units): the siblings of those that reshard all, where the space searches them.
pub fn keep_outers(space: &Space) -> Vec<Outer> {
    if !space.keep || !space.reshard.contains(&Reshard::None) {
        return vec![];
    }
    outers(space).into_iter().filter(|o| o.reshard == Reshard::All).flat_map(|o| (2..units_of(space, &o)).map(move |r| Outer { reshard: Reshard::Keep(r), ..o })).collect()
}

/// Blocks per unit searched by default: the divisors of the number of blocks (groups of
/// equal size) — larger groups only while they make the step without checkpointing faster
/// ([`search`]).
pub fn group_ladder(blocks: u32) -> Vec<u32> {
    (1..=blocks.max(1)).filter(|&k| blocks.max(1).is_multiple_of(k)).collect()
}

/// The outer points by family — the same choices but the unit group — each family's by
/// blocks per unit, ascending.
pub fn families(space: &Space) -> Vec<Vec<Outer>> {
    let mut at: HashMap<Outer, usize> = HashMap::new();
    let mut by: Vec<Vec<Outer>> = vec![];
    for o in outers(space) {
        let i = *at.entry(Outer { group: 0, ..o }).or_insert_with(|| {
            by.push(vec![]);
            by.len() - 1
        });
        by[i].push(o);
    }
    for v in &mut by {
        v.sort_by_key(|o| o.group);
    }
    by
}

/// How far below the best found a kept-unit count's floor ([`Reshard::Keep`], the third pass
/// of [`search`]) must be for the count to be searched: what keeping r units rather than
/// r0 < r saves is at most what it saves without checkpointing (checkpointing's recompute
/// does not enlarge the saving — to 0.01% of the step, brute force checks it for every
/// pair), and a configuration that fits keeping r units fits keeping r0 where the memory
/// grows with the units kept, so a count left unsearched is then at most this fraction
/// (+0.01%) faster than the answer.
pub const KEEP_TOLERANCE: f64 = 0.0025;

/// Consecutive rises of the boundary's time that end the walk over `full` (0: walk until
/// the bound alone stops it).
pub const PATIENCE: u32 = 2;

/// `a` is faster than `b` (ties to the smaller configuration: deterministic answers).
fn faster(a: (f64, Config), b: Option<(f64, Config)>) -> bool {
    b.is_none_or(|b| a.0 < b.0 || (a.0 == b.0 && a.1 < b.1))
}

/// The best configuration of one outer point that beats `bound`, if any (see the module
/// doc: the least SAC that fits for each number of fully checkpointed blocks — which never
/// grows with it — until a floor of the numbers left cannot win), and a floor of the outer
/// point's best time: that best where it was found, else what the search learnt on the way
/// (the floor where the walk stopped — `lowest` — the best of the numbers it walked; infinite
/// where nothing fits) — under the search's own terms (a replay monotone in SAC, the walk's
/// patience), as the best it finds is.
fn search_outer(ev: &mut Evaluator, o: Outer, bound: Option<(f64, Config)>) -> (Option<(f64, Config)>, f64) {
    // (each choice of the minor units, nothing checkpointed first, under the best so far: a
    // floor of each choice's best bounds the outer point's)
    let codes = ev.space.minor_codes(o.group);
    if codes.len() > 1 {
        // (nothing checkpointed is the fastest of every choice, every block fully checkpointed
        // the least memory: where the one cannot beat the bound or the other does not fit,
        // no choice is walked)
        let Some(t00) = ev.time(Config::none(o)) else { return (None, f64::INFINITY) };
        if !faster((t00, Config::none(o)), bound) {
            return (None, t00);
        }
        if !ev.fits(Config::every_full(ev.space, o)) {
            return (None, f64::INFINITY);
        }
    }
    let (mut best, mut floor) = (None, f64::INFINITY);
    for minor in codes {
        let (r, f) = search_minor(ev, o, fastest(best, bound), minor);
        best = fastest(best, r);
        floor = floor.min(f);
    }
    (best.filter(|&b| faster(b, bound)), floor)
}

/// [`search_outer`] with the minor units checkpointed as `minor` says ([`Config::minor`]).
fn search_minor(ev: &mut Evaluator, o: Outer, bound: Option<(f64, Config)>, minor: u32) -> (Option<(f64, Config)>, f64) {
    let front = walk(ev, o, bound, false, minor);
    // Counted from the back too where one unit checkpointed there is faster than at the
    // front (its recompute hidden behind communication the front's is not: the blocks'
    // position matters only through overlap; at real sizes the front is never slower —
    // Llama-3-8B on 8, 64 and 256 H100s, one, four and sixteen blocks — and the probe costs
    // two plans per outer point walked). The same walk, under the best of both so far.
    let (fc, bc) = (Counting::new(ev.space, o, minor, false), Counting::new(ev.space, o, minor, true));
    // (the front's floor is not the back's: nothing checkpointed bounds both; nothing fits
    // either way where every unit fully checkpointed, the same both ways, does not)
    let c00 = fc.cfg(0, 0);
    // (what the front found bounds the back: where nothing checkpointed fits, nothing is faster)
    let both = fastest(front.0, bound);
    if !ev.space.from_back || fc.units() < 2 || front.1.is_infinite() || !ev.time(c00).is_some_and(|t00| faster((t00, c00), both)) {
        return front;
    }
    // Where there was a bound to beat, the front's walk found `need`, the fewest units
    // fully checkpointed whose tensor peak fits (its peaks are known: no plan), and counted
    // from the front the first units need the least memory (module doc): so every
    // configuration counted from the back that fits checkpoints at least `need` units too,
    // and none is faster than the last `need` under SAC (property 1) — where that cannot
    // beat the bound, neither the probe nor the back's walk is needed (a plan, where the
    // probe takes two)
    if bound.is_some() {
        let need = need(ev, fc);
        if need > 0 {
            let lowest = if ev.space.sac { bc.cfg(0, need) } else { bc.cfg(need, 0) };
            // (and where it is no lower than the front's floor, that floor stands for both;
            // else the probe decides, as it would have, what floor is returned)
            match ev.time(lowest) {
                Some(lb) if !faster((lb, lowest), both) && lb >= front.1 => return front,
                None => return front,
                Some(_) => {}
            }
        }
    }
    let (Some(tf), Some(tb)) = (ev.time(fc.cfg(1, 0)), ev.time(bc.cfg(1, 0))) else { return front };
    // (to float rounding: summed in another order, the same time differs in its last bits)
    if tb >= tf * (1.0 - 1e-9) {
        return front;
    }
    let back = walk(ev, o, both, true, minor);
    (fastest(front.0, back.0), front.1.min(back.1))
}

/// The faster of two (either may be missing; [`faster`]'s order, ties to the smaller
/// configuration, so the same whichever comes first).
fn fastest(a: Option<(f64, Config)>, b: Option<(f64, Config)>) -> Option<(f64, Config)> {
    match a {
        Some(x) if faster(x, b) => Some(x),
        _ => b.or(a),
    }
}

/// An outer point's checkpointing counted in units from the front or the back: with unit
/// groups of k blocks, `full` and `sac` count groups of the blocks alike (the minor units as
/// `minor` says).
#[derive(Clone, Copy)]
struct Counting {
    o: Outer,
    blocks: u32,
    k: u32,
    minor: u32,
    back: bool,
}

impl Counting {
    fn new(space: &Space, o: Outer, minor: u32, back: bool) -> Counting {
        Counting { o, blocks: space.main_blocks(o.group) as u32, k: o.group.max(1), minor, back }
    }

    /// The units of the blocks alike.
    fn units(self) -> u32 {
        self.blocks.div_ceil(self.k)
    }

    /// The first (or last) `full` units fully checkpointed, the next `sac` under SAC.
    fn cfg(self, full: u32, sac: u32) -> Config {
        let f = (full * self.k).min(self.blocks);
        Config::new(self.o, f, (sac * self.k).min(self.blocks - f), self.back, self.blocks, self.minor)
    }
}

/// The fewest units fully checkpointed (so counted) whose tensor peak's floor is within the
/// limit: every configuration that fits checkpoints at least as many ([`walk`]).
fn need(ev: &mut Evaluator, c: Counting) -> u32 {
    let limit = ev.limit.bytes;
    least_under(0, c.units(), limit, &mut |f| ev.floor(c.cfg(f, 0)))
}

/// [`search_outer`]'s walk with checkpointing counted from the front or the back
/// ([`Config::back`]).
fn walk(ev: &mut Evaluator, o: Outer, bound: Option<(f64, Config)>, back: bool, minor: u32) -> (Option<(f64, Config)>, f64) {
    // checkpointing goes by units: with unit groups of k blocks, `full` and `sac` count
    // groups (a group's blocks are checkpointed alike; k divides the blocks, so the units are
    // identical, as counting them from the front takes) — of the units alike, the minor
    // units as `minor` says
    let counting = Counting::new(ev.space, o, minor, back);
    let l = counting.units();
    let sac_max = |full: u32| if ev.space.sac { l - full } else { 0 };
    let cfg = |full: u32, sac: u32| counting.cfg(full, sac);
    const NONE: (Option<(f64, Config)>, f64) = (None, f64::INFINITY);
    let c00 = cfg(0, 0);
    let Some(t00) = ev.time(c00) else { return NONE };
    if !faster((t00, c00), bound) {
        return (None, t00);
    }
    if ev.fits(c00) {
        return (Some((t00, c00)), t00);
    }
    if !ev.fits(cfg(l, 0)) {
        return NONE;
    }
    // (timed too: the least-memory end of the Pareto front)
    ev.time(cfg(l, 0));
    // Every configuration that fits checkpoints at least `need` units, the least number
    // fully checkpointed whose tensor peak's floor is within the limit (moving a unit from
    // SAC to full never raises the tensor peak, nor does checkpointing one more), so nothing
    // from level `full` on is faster than `lowest(full)`: its `full` units fully
    // checkpointed and SAC on the next up to `need` (moving a unit from full to SAC, or
    // checkpointing one fewer, is never slower); without SAC in the space, `need` fully
    // checkpointed. (Only where there is a bound to beat.) Kept units (the third pass) take
    // this floor as a floor of the counts kept too, where the memory grows with the units
    // kept (`KEEP_TOLERANCE`), as they take the best found
    let limit = ev.limit.bytes;
    let need = if bound.is_some() { need(ev, counting) } else { 0 };
    let lowest = |f: u32| if f >= need || !ev.space.sac { cfg(f.max(need), 0) } else { cfg(f, need - f) };
    match ev.time(lowest(0)) {
        Some(lb) if !faster((lb, lowest(0)), bound) => return (None, lb),
        None => return (None, t00),
        Some(_) => {}
    }
    // The first level with anything that fits. At each `full` the least memory is every
    // block checkpointed (`full` of them fully), and its tensor peak falls as `full` grows:
    // the levels whose peak alone is over the limit (the floor [`floor_bytes`] of what the
    // device needs) are skipped by a search on peaks ([`least_under`]), the next ones checked
    // in order until one fits (the replay need not be monotone there)
    let least = |f: u32| cfg(f, sac_max(f));
    let mut start = least_under(0, l, limit, &mut |f| ev.floor(least(f)));
    // (nothing from a level on is faster than `lowest` of it: when that cannot beat the
    // bound, nothing here can)
    if start > 0 {
        match ev.time(lowest(start)) {
            Some(lb) if !faster((lb, lowest(start)), bound) => return (None, lb),
            None => return (None, t00),
            Some(_) => {}
        }
    }
    // (a level whose least memory does not fit by the replay may still hold a configuration
    // that does — the replay need not be monotone: the fewest under SAC the floor allows,
    // `low`, is tried too; a tiny float8 Llama offloaded needs a 2 MiB segment more with its
    // second block under SAC than with it not checkpointed, the tensor peaks equal)
    let low = |f: u32| cfg(f, need.saturating_sub(f).min(sac_max(f)));
    while start < l && !ev.fits(least(start)) && !ev.fits(low(start)) {
        start += 1;
    }
    let mut local: Option<(f64, Config)> = None;
    let mut prev: Option<u32> = None;
    let mut drop = 1u32;
    let mut worse = 0;
    // (a floor of the numbers the walk leaves: `lowest` where it stops)
    let mut rest = f64::INFINITY;
    for full in start..=l {
        // the boundary's time along `full` rises once more full blocks cost more than the
        // SAC blocks they replace: two rises in a row end the walk (brute force checks it)
        if worse >= PATIENCE {
            break;
        }
        // the least sac that fits: at most the previous one (more full blocks need less)
        let top = prev.unwrap_or(sac_max(full)).min(sac_max(full));
        // `top` fits: after a boundary at `full - 1`, by monotonicity (one more block full
        // and one more checkpointed than that boundary's configuration); else checked
        // (nothing with fewer than `need - full` under SAC fits: the search's sides start there)
        let lo = need.saturating_sub(full).min(top);
        // (`known`: the boundary, where the anchor is the least that can fit)
        let (anchor, known) = match prev {
            Some(p) => (cfg(full - 1, p), None),
            None if ev.fits(cfg(full, top)) => (cfg(full, top), (lo == top).then_some(lo)),
            // (the replay not monotone: the level's fewest under SAC fits where its most does
            // not — and no fewer can)
            None if lo < top && ev.fits(cfg(full, lo)) => (cfg(full, lo), Some(lo)),
            None => continue,
        };
        // The boundary is first estimated on tensor peaks alone (a plan each, no allocator
        // replay) with the overhead the anchor needs beyond its peak, then confirmed exactly
        // on both sides; where the estimate is off, the exact search runs on the side it missed.
        // (Galloping from the last level's drop below `top`, not along the peaks' line as
        // [`least_under`] does: within a level the peak falls unevenly by the unit under SAC —
        // Llama-3.1-405B on 16,384, 1 × 4096: the line through two neighbours' peaks missed
        // by four units, and the search took 3,110 plans against the gallop's 3,100.)
        let est = match ev.overhead(anchor).filter(|_| known.is_none()) {
            Some(over) => {
                let limit = ev.limit.bytes;
                let mut guess = |x: u32| ev.peak(cfg(full, x)).is_some_and(|p| p.saturating_add(over) <= limit);
                boundary(lo, top, if prev.is_some() { drop.max(1) } else { 1 }, &mut guess)
            }
            None => top,
        };
        let hi = if let Some(k) = known {
            k
        } else if !ev.fits(cfg(full, est)) {
            boundary_up(est + 1, top, &mut |x| ev.fits(cfg(full, x)))
        } else if est > lo && ev.fits(cfg(full, est - 1)) {
            boundary(lo, est - 1, 1, &mut |x| ev.fits(cfg(full, x)))
        } else {
            est
        };
        // (`top` after a boundary is taken to fit by monotonicity, unchecked; the allocator
        // replay need not be monotone — near the device's size a request can fail with more
        // checkpointing where it did not with less (Llama-3-8B, 8 ranks, 1 × 8192, 4
        // micro-batches: 26, 28, 30 and 31 blocks under SAC fit, 27 and 29 do not) — so the
        // boundary found is confirmed: a configuration that does not fit is never an answer.
        // If it does not fit the level is left (sac above `top` is slower than the previous
        // boundary, which fits, and stays the cap); the search is exact where the replay is
        // monotone, the tensor peak always is — as is the floor returned: the level adds
        // nothing to it)
        if !ev.fits(cfg(full, hi)) {
            continue;
        }
        drop = prev.map_or(1, |p| p.saturating_sub(hi));
        prev = Some(hi);
        let Some(t) = ev.time(cfg(full, hi)) else { continue };
        if !faster((t, cfg(full, hi)), bound) && full > 0 {
            match ev.time(lowest(full)) {
                // nothing from here on can beat the bound
                Some(lb) if !faster((lb, lowest(full)), bound) => {
                    rest = rest.min(lb);
                    break;
                }
                None => {
                    rest = rest.min(t00);
                    break;
                }
                Some(_) => {}
            }
        }
        if faster((t, cfg(full, hi)), local) {
            local = Some((t, cfg(full, hi)));
            worse = 0;
        } else {
            worse += 1;
        }
    }
    (local.filter(|&l| faster(l, bound)), local.map_or(rest, |l| l.0.min(rest)))
}

/// The least `x` in `lo..=hi` with `fits(x)`, where `fits(hi)` holds and `fits` is monotone
/// (false below the boundary, true from it): gallop down from `hi` in steps from `step`
/// doubling, then bisect.
fn boundary(lo: u32, hi: u32, step: u32, fits: &mut dyn FnMut(u32) -> bool) -> u32 {
    let (mut lo, mut hi, mut step) = (lo, hi, step.max(1));
    while hi > lo {
        let probe = hi.saturating_sub(step).max(lo);
        if fits(probe) {
            hi = probe;
            step = step.saturating_mul(2);
        } else {
            lo = probe + 1;
            break;
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// The least `x` in `lo..=hi` with `v(x) <= target`, where `v` falls as `x` grows (`None`:
/// over any target) and `v(hi) <= target`: the same answer as bisection, found by probing
/// where the line through the last two points probed meets the target — the bracket's ends
/// first (the tensor peak falls by about the same bytes per block checkpointed), then the
/// newest two, whose line is the nearer to the boundary where the fall bends (the probe
/// lands on the boundary, then the next one, clamped inside the bracket, on its other side)
/// — and bisecting where a line cannot tell ([`SECANTS`] probes at most: then bisecting).
fn least_under(lo: u32, hi: u32, target: u64, v: &mut dyn FnMut(u32) -> Option<u64>) -> u32 {
    let (mut lo, mut hi) = (lo, hi);
    let vlo = v(lo).unwrap_or(u64::MAX);
    if vlo <= target || lo >= hi {
        return lo;
    }
    if hi - lo == 1 {
        return hi;
    }
    // invariant: v(lo) > target >= v(hi)
    let vhi = v(hi).unwrap_or(0).min(target);
    let (mut a, mut b) = ((lo, vlo), (hi, vhi));
    let mut secants = 0;
    while hi - lo > 1 {
        let probe = match secant(a, b, target) {
            Some(x) if secants < SECANTS => x.clamp(lo + 1, hi - 1),
            _ => lo + (hi - lo) / 2,
        };
        secants += 1;
        let at = v(probe).unwrap_or(u64::MAX);
        if at <= target {
            hi = probe;
        } else {
            lo = probe;
        }
        (a, b) = (b, (probe, at));
    }
    hi
}

/// Line probes [`least_under`] makes before it bisects.
const SECANTS: u32 = 4;

/// Where the line through two points `(x, v(x))` meets `target`, rounded up (`None`: no line —
/// a value unknown, or both the same).
fn secant((x1, v1): (u32, u64), (x2, v2): (u32, u64), target: u64) -> Option<u32> {
    if v1 == u64::MAX || v2 == u64::MAX || v1 == v2 || x1 == x2 {
        return None;
    }
    let (x1, v1, x2, v2) = (f64::from(x1), v1 as f64, f64::from(x2), v2 as f64);
    let x = x1 + (target as f64 - v1) * (x2 - x1) / (v2 - v1);
    // (clamped by the caller: only its side of the bracket matters)
    x.is_finite().then(|| x.ceil().clamp(0.0, f64::from(u32::MAX)) as u32)
}

/// [`boundary`] searching up from `lo` (everything below `lo` is known not to fit): probes
/// `lo`, `lo + 1`, `lo + 3`, … until one fits, then bisects.
fn boundary_up(lo: u32, hi: u32, fits: &mut dyn FnMut(u32) -> bool) -> u32 {
    let (mut lo, mut step) = (lo, 1u32);
    loop {
        let probe = lo.saturating_add(step - 1).min(hi);
        if probe >= hi || fits(probe) {
            return boundary(lo, probe, u32::MAX, fits);
        }
        lo = probe + 1;
        step = step.saturating_mul(2);
    }
}

/// Search lanes per thread: the outer points are dealt to `threads ×` this many lanes, each
/// searched (fastest first) with its own bound, a thread taking the next lane when it is done
/// with one — two per thread balance the threads (an outer point's search costs from
/// nothing to tens of plans) at about the same plans (Llama-3-8B on 8 GPUs at global batch
/// 16: 1,066 → 1,062 plans, and 12–18% less wall time than two lanes in interleaved runs of
/// three scenarios).
pub const LANES_PER_THREAD: usize = 2;

/// The search (see the module doc) on `threads` threads: every outer point timed with no
/// checkpointing, then the outer points in the order of an estimate of their best
/// ([`estimates`]) dealt to [`LANES_PER_THREAD`] lanes per thread in turn, each searching its
/// own (in that order) with its own bound, so that the
/// answer and the lists do not depend on timing. `progress(planned, outer points done, of)`
/// is called as outer points finish.
///
/// Where the space has CPU offload and without it, the outer points without it are searched
/// first; then those offloaded, under their best as a bound, only at the shard groups where
/// the host's optimizer step alone ([`crate::cost::host_step_floor_s`]: every offloaded step
/// waits for it) is no slower than that best — the others cannot beat it (Llama-3-8B on 8
/// GPUs at 16 × 8192: 1,400 → 1,184 plans, the same answer).
pub fn search(model: &Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit, threads: usize, progress: &(dyn Fn(usize, usize, usize) + Sync)) -> Tuned {
    if space.offload != [false, true] {
        return search_with(model, base, hw, space, limit, threads, progress, None);
    }
    let on_device = search_with(model, base, hw, &Space { offload: vec![false], ..space.clone() }, limit, threads, progress, None);
    let bound = on_device.best.as_ref().map(|b| (b.step_time_s, b.config));
    let trainable: u64 = model.params.iter().filter(|p| p.requires_grad && p.tied_to.is_none()).map(|p| p.numel()).sum();
    let shards: Vec<u64> = space.shards.iter().copied().filter(|&g| bound.is_none_or(|(t, _)| crate::cost::host_step_floor_s(hw, base, trainable, g) <= t)).collect();
    if shards.is_empty() {
        return on_device;
    }
    let before = on_device.plans_built;
    let shifted = |planned: usize, done: usize, of: usize| progress(planned + before, done, of);
    let off = search_with(model, base, hw, &Space { offload: vec![true], shards, ..space.clone() }, limit, threads, &shifted, bound);
    let best = [on_device.best, off.best].into_iter().flatten().fold(None::<Eval>, |b, e| if faster((e.step_time_s, e.config), b.as_ref().map(|b| (b.step_time_s, b.config))) { Some(e) } else { b });
    let mut per_outer: Vec<Eval> = on_device.per_outer.into_iter().chain(off.per_outer).collect();
    per_outer.sort_by(|a, b| a.step_time_s.total_cmp(&b.step_time_s).then(a.config.cmp(&b.config)));
    let mut evaluated: Vec<Eval> = on_device.evaluated.into_iter().chain(off.evaluated).collect();
    evaluated.sort_by_key(|a| a.config);
    Tuned { best, per_outer, evaluated, plans_built: before + off.plans_built }
}

/// [`search`] over `space` as it is, every lane's search (and the kept-unit pass) bounded by
/// `bound` from the start: only what beats it is found.
#[allow(clippy::too_many_arguments)]
fn search_with(model: &Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit, threads: usize, progress: &(dyn Fn(usize, usize, usize) + Sync), bound: Option<(f64, Config)>) -> Tuned {
    // the master dtype's copy of the model once, not in every plan (`plan_unchecked` makes it
    // when the params are in another dtype)
    let recast = crate::recast(model, base);
    let model = recast.as_ref().unwrap_or(model);
    // (a space that lists op-level SAC where the options refuse it — `Space` is public — is
    // searched without it: its walks and floors take SAC's configurations as plannable)
    let allowed = Space { sac: space.sac && sac_allowed(base, &space.blocks), ..space.clone() };
    let space = &allowed;
    // (not the shard groups where what stays on the device alone is over the limit: but the
    // largest, whose plans say what does not fit where nothing does)
    let largest = space.shards.iter().copied().max().unwrap_or(base.world_size);
    let over: Vec<u64> = space.shards.iter().copied().filter(|&g| g != largest && floor_bytes(resident_floor(model, base, g), base.device, limit) > limit.bytes).collect();
    let families: Vec<Vec<Outer>> = families(space).into_iter().filter(|f| f.first().is_none_or(|o| o.offload || !over.contains(&o.shard))).collect();
    let threads = threads.clamp(1, families.len().max(1));
    let done = std::sync::atomic::AtomicUsize::new(0);
    let planned = std::sync::atomic::AtomicUsize::new(0);
    // 1. the fastest (no checkpointing) time of each outer point, which bounds its search
    // and (with the checkpointing its memory calls for: [`estimates`]) orders the search
    // (the threads take every `threads`-th family); along a family's unit groups, larger
    // groups only while that time falls
    type Timed = Vec<(f64, Outer, Known, Option<Units>)>;
    let timed: Vec<Timed> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<&Vec<Outer>> = families.iter().skip(t).step_by(threads).collect();
                let planned = &planned;
                s.spawn(move || crate::schedule::without_names(|| {
                    let mut ev = Evaluator::new(model, base, hw, space, limit);
                    let mut out: Timed = vec![];
                    for family in mine {
                        let mut last: Option<f64> = None;
                        for &o in family {
                            let c = Config::none(o);
                            let Some(t) = ev.time(c) else { break };
                            if !space.every_group && last.is_some_and(|l| t >= l) {
                                break;
                            }
                            last = Some(t);
                            // (its units go with it to the lane that searches it)
                            let prep = ev.prepared(o);
                            out.push((t, o, ev.known.get(&c).cloned().unwrap_or_default(), prep));
                        }
                    }
                    planned.fetch_add(ev.planned(), std::sync::atomic::Ordering::Relaxed);
                    out
                }))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut firsts: Timed = timed.into_iter().flatten().collect();
    let first_time: HashMap<Outer, f64> = firsts.iter().map(|(t, o, _, _)| (*o, *t)).collect();
    let n = firsts.len();
    // (sorted by an estimate of each one's best: [`estimates`])
    let est = estimates(model, base, hw, space, limit, &firsts, &planned);
    let key = |t: f64, o: &Outer| est.get(o).copied().unwrap_or(t);
    firsts.sort_by(|a, b| key(a.0, &a.1).total_cmp(&key(b.0, &b.1)).then(a.0.total_cmp(&b.0)).then(a.1.cmp(&b.1)));
    let nl = threads * LANES_PER_THREAD;
    type Mine = Vec<(Outer, Known, Option<Units>)>;
    let mut lanes: Vec<Mine> = (0..nl).map(|_| vec![]).collect();
    for (i, (_, o, k, p)) in firsts.into_iter().enumerate() {
        lanes[i % nl].push((o, k, p));
    }
    let lanes: Vec<std::sync::Mutex<Option<Mine>>> = lanes.into_iter().map(|l| std::sync::Mutex::new(Some(l))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    // 2. the outer points in that order, dealt to the lanes in turn (each lane gets as many
    // of the promising ones), each lane bounding its search by the best it found, the threads
    // taking the lanes one after the other: the best of each outer point searched, and what
    // each thread evaluated
    type Lane = (Vec<(f64, Config)>, Vec<Eval>);
    // (and per outer point searched, a floor of its best: `search_outer`'s)
    let searched: Vec<(Lane, Vec<(Outer, f64)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (done, planned, lanes, next) = (&done, &planned, &lanes, &next);
                s.spawn(move || crate::schedule::without_names(|| {
                    let mut ev = Evaluator::new(model, base, hw, space, limit);
                    let mut found = vec![];
                    let mut floors = vec![];
                    let mut counted = 0;
                    loop {
                        let li = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(mine) = lanes.get(li).and_then(|l| l.lock().ok().and_then(|mut g| g.take())) else { break };
                        let outers: Vec<Outer> = mine.iter().map(|(o, _, _)| *o).collect();
                        for (o, k, p) in mine {
                            ev.seed(Config::none(o), k, p);
                        }
                        let mut best: Option<(f64, Config)> = bound;
                        for o in outers {
                            let bound = best;
                            let (r, floor) = search_outer(&mut ev, o, bound);
                            floors.push((o, floor));
                            if let Some(r) = r {
                                found.push(r);
                                best = Some(r);
                            }
                            report(&ev, &mut counted, planned, done, n, progress);
                        }
                    }
                    ((found, ev.evaluated()), floors)
                }))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let floor: HashMap<Outer, f64> = searched.iter().flat_map(|(_, f)| f.iter().copied()).collect();
    let results: Vec<Lane> = searched.into_iter().map(|(l, _)| l).collect();
    // 3. kept units: the siblings of each outer point resharding all that keep its last r
    // units (2 ≤ r < the units), where they can beat the best by more than KEEP_TOLERANCE
    let best = results.iter().flat_map(|r| r.0.iter().copied()).fold(bound, |b, x| if faster(x, b) { Some(x) } else { b });
    let kept: Vec<Lane> = match best {
        Some(best) if space.keep => {
            let mut fams: Vec<(f64, Outer)> = first_time.iter().filter(|(o, _)| o.reshard == Reshard::All && units_of(space, o) > 2).map(|(o, &t0)| (t0, *o)).collect();
            fams.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let threads = threads.clamp(1, fams.len().max(1));
            let of = n + fams.len();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let mine: Vec<(f64, Outer)> = fams.iter().skip(t).step_by(threads).copied().collect();
                        let (done, planned, first_time, floor) = (&done, &planned, &first_time, &floor);
                        s.spawn(move || crate::schedule::without_names(|| {
                            let mut ev = Evaluator::new(model, base, hw, space, limit);
                            let mut found = vec![];
                            let mut bound = best;
                            let mut counted = 0;
                            for (t0, o) in mine {
                                // `None` keeps every unit: no r does better without
                                // checkpointing (timed here where the first pass did not)
                                let on = Outer { reshard: Reshard::None, ..o };
                                let tn = first_time.get(&on).copied().or_else(|| ev.time(Config::none(on)));
                                let b0 = floor.get(&o).copied().unwrap_or(f64::INFINITY);
                                if let Some(tn) = tn {
                                    search_kept(&mut ev, o, (t0, tn, b0), &mut bound, &mut found);
                                }
                                report(&ev, &mut counted, planned, done, of, progress);
                            }
                            (found, ev.evaluated())
                        }))
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            })
        }
        _ => vec![],
    };
    let results: Vec<Lane> = results.into_iter().chain(kept).collect();
    let mut per_outer: Vec<(f64, Config)> = results.iter().flat_map(|r| r.0.iter().copied()).collect();
    per_outer.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut evaluated: Vec<Eval> = results.into_iter().flat_map(|r| r.1).collect();
    evaluated.sort_by_key(|a| a.config);
    let by_config: HashMap<Config, Eval> = evaluated.iter().map(|e| (e.config, e.clone())).collect();
    let mut per_outer: Vec<Eval> = per_outer.iter().filter_map(|(_, c)| by_config.get(c).cloned()).collect();
    // (the answer as `plan` predicts it: in full where a shorter accumulation's plan stood
    // for it, and so whatever ties with it)
    let settled = settle_first(model, base, hw, space, limit, &mut per_outer, 1);
    for b in per_outer.iter().filter(|b| !b.proxied) {
        if let Some(e) = evaluated.iter_mut().find(|e| e.proxied && e.config == b.config) {
            *e = b.clone();
        }
    }
    Tuned { best: per_outer.first().cloned(), per_outer, evaluated, plans_built: planned.into_inner() + settled }
}

/// An estimate of each outer point's best time, which orders the second pass (the order
/// decides only how soon a lane's bound is tight, never what is found): its time with nothing
/// checkpointed plus the recompute of the checkpointing its memory over the limit calls for,
/// at the per-block memory saved and time added by full AC and op-level SAC measured on one
/// outer point per micro-batch (the accumulation follows from it): every block fully
/// checkpointed and every one under SAC, against nothing checkpointed, each plan replayed for
/// what the device needs beyond the tensor peak. Outer points whose estimate finds no split
/// that fits come last.
fn estimates(model: &Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit, firsts: &[(f64, Outer, Known, Option<Units>)], planned: &std::sync::atomic::AtomicUsize) -> HashMap<Outer, f64> {
    let mut ev = Evaluator::new(model, base, hw, space, limit);
    let mut rates: HashMap<u64, Option<Rates>> = HashMap::new();
    let mut fastest: Vec<&(f64, Outer, Known, Option<Units>)> = firsts.iter().collect();
    fastest.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    for (t0, o, k, _) in fastest {
        if rates.contains_key(&o.micro_batch) {
            continue;
        }
        let Some((p0, _)) = k.peak else { continue };
        rates.insert(o.micro_batch, Rates::measure(&mut ev, *o, *t0, p0));
    }
    planned.fetch_add(ev.planned(), std::sync::atomic::Ordering::Relaxed);
    let mut est = HashMap::new();
    for (t0, o, k, _) in firsts {
        let (Some(Some(Rates { full_bytes: df, full_s: rf, sac_bytes: ds, sac_s: rs, over })), Some((p0, _))) = (rates.get(&o.micro_batch), &k.peak) else { continue };
        let excess = floor_bytes(*p0, base.device, limit) as f64 + over - limit.bytes as f64;
        if excess <= 0.0 {
            est.insert(*o, *t0);
            continue;
        }
        // the least recompute over the (full, SAC) splits whose savings cover the excess
        let blocks = space.main_blocks(o.group) as u32;
        let mut best = f64::INFINITY;
        for f in 0..=blocks {
            let short = excess - f64::from(f) * df;
            let s = if short <= 0.0 { 0.0 } else if *ds > 0.0 { (short / ds).ceil() } else { f64::INFINITY };
            if f64::from(f) + s <= f64::from(blocks) {
                best = best.min(f64::from(f) * rf + s * rs);
            }
        }
        est.insert(*o, t0 + best);
    }
    est
}

/// What checkpointing does per block at an outer point ([`estimates`]).
struct Rates {
    /// Bytes of tensor peak one more block fully checkpointed saves …
    full_bytes: f64,
    /// … and seconds of step it adds.
    full_s: f64,
    /// The same under op-level SAC (0 where the space has none).
    sac_bytes: f64,
    sac_s: f64,
    /// What the device needs beyond the tensor peak (every block fully checkpointed).
    over: f64,
}

impl Rates {
    /// At `o` (nothing checkpointed: `t0` seconds, a tensor peak of `p0` bytes): every block
    /// fully checkpointed, then every one under SAC (`None`: refused).
    fn measure(ev: &mut Evaluator, o: Outer, t0: f64, p0: u64) -> Option<Rates> {
        let blocks = ev.space.main_blocks(o.group) as u32;
        let full = Config::new(o, blocks, 0, false, blocks, 0);
        let tf = ev.time(full)?;
        let pf = ev.peak(full)?;
        ev.fits(full);
        let over = ev.overhead(full).unwrap_or(0) as f64;
        let b = f64::from(blocks.max(1));
        let (sac_bytes, sac_s) = match ev.space.sac {
            true => {
                let sac = Config::new(o, 0, blocks, false, blocks, 0);
                ((p0 as f64 - ev.peak(sac)? as f64) / b, (ev.time(sac)? - t0) / b)
            }
            false => (0.0, 0.0),
        };
        Some(Rates { full_bytes: (p0 as f64 - pf as f64) / b, full_s: (tf - t0) / b, sac_bytes, sac_s, over })
    }
}

/// Relative difference of step times within which a time from a shorter accumulation's plan
/// ([`SHORT_ACCUM`]) may tie with another: float rounding (at most 10⁻¹² in the tests'
/// cases).
const TIE: f64 = 1e-9;

fn ties(a: f64, b: f64) -> bool {
    (a - b).abs() <= TIE * a.abs().max(b.abs())
}

/// Plans in full ([`settle`]) the first `n` of `per_outer` (fastest first, as a search
/// returns it) and every configuration whose time ties with one of them, and sorts it again:
/// the first `n` are then in the order, and of the configurations, that full plans give
/// (configurations whose full plans tie exactly are taken in their order). The plans built.
pub fn settle_first(model: &Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit, per_outer: &mut [Eval], n: usize) -> usize {
    let firsts: Vec<f64> = per_outer.iter().take(n).map(|e| e.step_time_s).collect();
    let near: Vec<&mut Eval> = per_outer.iter_mut().enumerate().filter(|(i, e)| *i < n || firsts.iter().any(|&t| ties(t, e.step_time_s))).map(|(_, e)| e).collect();
    let planned = settle(model, base, hw, space, limit, near);
    per_outer.sort_by(|a, b| a.step_time_s.total_cmp(&b.step_time_s).then(a.config.cmp(&b.config)));
    planned
}

/// [`pareto`] of `evals` as full plans give it: its members, and every configuration whose
/// tokens/s ties with one of them, planned in full ([`settle`]) before the front is taken
/// again (a configuration that does not tie with the front cannot enter or leave it by float
/// rounding). `evals` gets the full plans' figures. The front, and the plans built.
pub fn settled_pareto(model: &Model, base: &Options, hw: &Hardware, space: &Space, limit: Limit, evals: &mut [Eval]) -> (Vec<Eval>, usize) {
    let mut planned = 0;
    // (a front that settling changes is settled again; a configuration the planner refuses
    // in full stays as it was: a few rounds)
    for _ in 0..3 {
        let front = pareto(evals);
        let near: Vec<&mut Eval> = evals.iter_mut().filter(|e| e.proxied && (front.iter().any(|f| ties(f.tokens_per_s_per_gpu, e.tokens_per_s_per_gpu)))).collect();
        if near.is_empty() {
            break;
        }
        planned += settle(model, base, hw, space, limit, near);
    }
    (pareto(evals), planned)
}

/// The kept-unit counts of outer point `o` resharding all ([`Reshard::Keep`], the third pass
/// of [`search`]), given its time without checkpointing `t0`, `None`'s `tn` and a floor `b0`
/// of its best. Keeping r units saves at most what it saves without checkpointing (and
/// keeping r rather than r0 < r, at most what that saves without), so the best of r is at
/// least `off + t(r)`, `t(r)` its time without checkpointing and `off` the most of `b0 - t0`
/// and, for every count r0 searched, the floor of its best less `t(r0)`. Counts are searched
/// from the fewest up: the next is the least (bisection: `t` falls as r grows) whose floor
/// is more than [`KEEP_TOLERANCE`] below the bound, until none is or the floor of what its
/// every block fully checkpointed needs (tensor peak and context) is over the limit by more
/// than a unit's params (keeping one more unit lowers the tensor peak by no more; a count
/// nearer, or only the allocator replay finds over, is passed by: the replay's fragmentation
/// need not grow with the units kept). What beats `bound` goes to `found` and becomes the
/// bound.
fn search_kept(ev: &mut Evaluator, o: Outer, (t0, tn, b0): (f64, f64, f64), bound: &mut (f64, Config), found: &mut Vec<(f64, Config)>) {
    let space = ev.space;
    let u = units_of(space, &o);
    let keep = |r: u32| Outer { reshard: Reshard::Keep(r), ..o };
    // (a refused count is never searched: the planner refuses none by the count, which only
    // sets per-unit reshard flags)
    let t = |ev: &mut Evaluator, r: u32| ev.time(Config::none(keep(r))).unwrap_or(f64::INFINITY);
    let mut off = (b0 - t0).max(0.0);
    let mut lo = 2;
    // (the last count was passed by)
    let mut next = false;
    loop {
        // below this, a count's time without checkpointing leaves its floor more than the
        // tolerance under the bound (`None` keeps every unit: no count is faster)
        let under = bound.0 / (1.0 + KEEP_TOLERANCE) - off;
        if lo >= u || tn >= under || t(ev, u - 1) >= under {
            return;
        }
        let (mut a, mut r) = (lo, u - 1);
        if next && t(ev, lo) < under {
            r = lo;
        }
        next = false;
        while a < r {
            let mid = a + (r - a) / 2;
            if t(ev, mid) < under {
                r = mid;
            } else {
                a = mid + 1;
            }
        }
        // every block fully checkpointed needs the least memory: where the floor of what it
        // needs (its tensor peak and the context) is over the limit by more than a unit's
        // params, so is every count from here on (keeping one more unit never lowers the
        // tensor peak by more: a unit gathered in backward briefly holds its all-gather output
        // beside its params, a kept one does not); nearer the limit, or where only the
        // allocator replay finds it over (its fragmentation need not grow with the units
        // kept), the next count may fit
        let least = Config::every_full(space, keep(r));
        let Some(floor) = ev.floor(least) else { return };
        // (offloaded past the node's host memory: so is every count, whose host share is the
        // same shards, grads and optimizer state)
        if floor > ev.limit.bytes.saturating_add(ev.unit_bytes(least)) || ev.host_over(least) {
            return;
        }
        if floor > ev.limit.bytes || !ev.fits(least) {
            // (the next count, one more kept, is no slower: the least whose floor is under)
            lo = r + 1;
            next = true;
            continue;
        }
        let (mut x, mut floor) = search_outer(ev, keep(r), Some(*bound));
        // where nothing need be checkpointed, the most units kept that need nothing either
        // are no slower than any count between (bisection on the fit: the boundary it finds
        // where the replay is not monotone in the units kept; the counts past it are still
        // the chain's)
        if x.is_some_and(|x| !x.1.checkpoints()) {
            let (mut a, mut b) = (r, u - 1);
            while a < b {
                let mid = a + (b - a).div_ceil(2);
                if ev.fits(Config::none(keep(mid))) {
                    a = mid;
                } else {
                    b = mid - 1;
                }
            }
            if a > r {
                if let Some(x) = x {
                    found.push(x);
                    *bound = x;
                }
                r = a;
                (x, floor) = search_outer(ev, keep(r), Some(*bound));
            }
        }
        if let Some(x) = x {
            found.push(x);
            *bound = x;
        }
        off = off.max(floor - t(ev, r));
        lo = r + 1;
    }
}

/// Counts the plans `ev` built since `counted` into `planned` and one more outer choice into
/// `done`, and reports the progress (of `of` outer choices).
fn report(ev: &Evaluator, counted: &mut usize, planned: &std::sync::atomic::AtomicUsize, done: &std::sync::atomic::AtomicUsize, of: usize, progress: &(dyn Fn(usize, usize, usize) + Sync)) {
    use std::sync::atomic::Ordering::Relaxed;
    planned.fetch_add(ev.planned() - *counted, Relaxed);
    *counted = ev.planned();
    let d = done.fetch_add(1, Relaxed) + 1;
    progress(planned.load(Relaxed), d, of);
}

/// The evaluated configurations no other beats on both memory and speed (least memory
/// first): the Pareto front of memory needed against tokens/s.
pub fn pareto(evals: &[Eval]) -> Vec<Eval> {
    let mut v: Vec<&Eval> = evals.iter().filter(|e| e.needed_bytes.is_some()).collect();
    v.sort_by(|a, b| a.needed_bytes.cmp(&b.needed_bytes).then(b.tokens_per_s_per_gpu.total_cmp(&a.tokens_per_s_per_gpu)));
    let mut out: Vec<Eval> = vec![];
    for e in v {
        if out.last().is_none_or(|l| e.tokens_per_s_per_gpu > l.tokens_per_s_per_gpu) {
            out.push(e.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `least_under` against a scan, for every bracket up to 40 wide and every boundary in
    /// it, on falling shapes (linear, convex, concave, flat stretches, refused values below
    /// the boundary): the same answer, in few probes (4 on a line: its ends, the point where
    /// the line meets the target and the one below).
    #[test]
    fn least_under_finds_the_boundary_a_scan_finds() {
        const T: u64 = 1_000_000;
        type Shape = fn(u32, u32) -> Option<u64>;
        // (distance below the boundary `d` ≥ 1 → over the target; at or past it → under)
        let shapes: [(&str, Shape, Shape); 5] = [
            ("line", |d, _| Some(T + 1000 * d as u64), |e, _| Some(T.saturating_sub(1000 * e as u64))),
            ("convex", |d, _| Some(T + 10 * (d as u64).pow(3)), |e, _| Some(T.saturating_sub(10 * e as u64))),
            ("concave", |d, _| Some(T + 1000 * (d as u64).isqrt().max(1)), |e, _| Some(T.saturating_sub(1000 * (e as u64).pow(2)))),
            ("flat", |d, _| Some(T + if d > 3 { 50_000 } else { 1 }), |e, _| Some(T - if e > 2 { 50_000 } else { 0 })),
            ("refused", |d, w| if d > w / 3 { None } else { Some(T + 1000 * d as u64) }, |e, _| Some(T.saturating_sub(1000 * e as u64))),
        ];
        let mut runs = 0;
        for (name, over, under) in shapes {
            for lo in [0u32, 3] {
                for width in 0..=40u32 {
                    let hi = lo + width;
                    for b in lo..=hi {
                        let mut probes = 0u32;
                        let v = &mut |x: u32| {
                            assert!((lo..=hi).contains(&x), "{name}: probe {x} outside {lo}..={hi}");
                            probes += 1;
                            if x >= b { under(x - b, width) } else { over(b - x, width) }
                        };
                        let got = least_under(lo, hi, T, v);
                        assert_eq!(got, b, "{name}: least_under({lo}, {hi}) with the boundary at {b}");
                        let bits = 32 - width.leading_zeros();
                        assert!(probes <= 2 * bits + 5, "{name}: {probes} probes for a bracket {width} wide");
                        if name == "line" {
                            assert!(probes <= 4, "line: {probes} probes for a bracket {width} wide, boundary at {b}");
                        }
                        runs += 1;
                    }
                }
            }
        }
        assert_eq!(runs, 5 * 2 * (1..=41).sum::<u32>());
    }
}
