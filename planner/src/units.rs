//! Pass 2, units and shard layout: which params each FSDP unit owns, in what order, and
//! how they are padded and sharded.
//!
//! FSDP2: `fully_shard` runs bottom-up; each call collects its modules in post-order,
//! stopping at nested units, and dedupes params by identity (a tied weight is owned once).
//! Each param is sharded on dim 0 into `ceil(d0/ws)`-row chunks (padded per param), or on
//! the dim `--shard-dim` names (FSDP2's `shard_placement_fn`: `ceil(len/ws)` slices of it).
//! FSDP1 (`flat`): pre-order concatenation into one FlatParameter padded to a multiple of ws.

use crate::error::PlanError;
use crate::ids::UnitId;
use crate::options::{Layout, Options};
use crate::wrap::Tree;
use fsdp_ir::{DType, Model};
use serde::{Deserialize, Serialize};
use rustc_hash::FxHashMap as HashMap;

/// One parameter storage inside a unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitParam {
    /// Primary name.
    pub name: String,
    /// Other names of the same tensor (tied aliases), with their modules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub requires_grad: bool,
    pub numel: u64,
    /// Elements of the padded unsharded tensor (fsdp2: ws·ceil(d0/ws)·rest; flat: numel).
    pub padded_numel: u64,
    /// Elements of one rank's padded shard (fsdp2); flat: 0 (the unit's flat shard counts).
    pub shard_numel: u64,
    /// Offset in the per-rank shard row (fsdp2) or in the flat parameter (flat).
    pub offset: u64,
    /// The weight of a float8 linear (`--float8`, [`crate::float8`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub float8: bool,
    /// The dim it is sharded on (FSDP2's `Shard(dim)`, `--shard-dim`; 0 by default).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shard_dim: u32,
}

fn is_zero(d: &u32) -> bool {
    *d == 0
}

impl UnitParam {
    /// The length of the dim it is sharded on and the elements of one slice of it (FSDP2
    /// chunks that dim: `ceil(len/ws)` slices a rank; dim 0 by default).
    pub fn shard_split(&self) -> (u64, u64) {
        let d0 = self.shape.get(self.shard_dim as usize).copied().unwrap_or(1);
        (d0, self.numel / d0.max(1))
    }
    /// Real (unpadded) elements rank `r` holds (fsdp2 chunking of its shard dim).
    pub fn local_numel(&self, ws: u64, r: u64) -> u64 {
        let (d0, rest) = self.shard_split();
        let c = d0.div_ceil(ws);
        let rows = d0.saturating_sub(r * c).min(c);
        rows * rest
    }
    /// Bytes of rank 0's unpadded shard of the param's gradient — and of each Adam moment,
    /// and of an offloaded grad on the host; 0 for a frozen param.
    pub fn grad_shard_bytes(&self, ws: u64) -> u64 {
        if self.requires_grad {
            self.local_numel(ws, 0) * self.dtype.size()
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unit {
    pub id: UnitId,
    /// Module path (`""` = root); of a unit group, its first module's.
    pub module: String,
    /// A unit group's other modules (`--unit-group`: `fully_shard([m0, m1, …])`), in forward
    /// order after `module`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<String>,
    pub class: String,
    pub params: Vec<UnitParam>,
    /// Real elements.
    pub numel: u64,
    /// Unsharded group buffer elements incl. padding (what the all-gather produces).
    pub padded_numel: u64,
    /// Per-rank shard elements (all-gather input).
    pub shard_numel: u64,
    /// Padded elements of params that require grad (what the reduce-scatter takes).
    pub grad_padded_numel: u64,
    pub reshard_after_forward: bool,
    /// `reshard_after_forward=N` (FSDP2's int): resharded after forward to groups of N
    /// consecutive ranks, not to the whole shard group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard_to: Option<u64>,
    /// Original dtype of the params (uint8 when mixed).
    pub dtype: DType,
}

impl Unit {
    pub fn is_root(&self) -> bool {
        self.module.is_empty()
    }
    /// The unit's modules as FSDP2 names a unit group (`model.layers.0, model.layers.1`);
    /// one module's path otherwise (`""`: the root).
    pub fn modules_joined(&self) -> String {
        std::iter::once(self.module.as_str()).chain(self.group.iter().map(String::as_str)).collect::<Vec<_>>().join(", ")
    }
    /// The unit's modules as a `modules:` policy names a unit of several
    /// (`model.norm+lm_head`, `model.layers.0+model.layers.1`); `root` or the path otherwise.
    pub fn name(&self) -> String {
        std::iter::once(self.label()).chain(self.group.iter().map(String::as_str)).collect::<Vec<_>>().join("+")
    }
    /// `root` or the module path.
    pub fn label(&self) -> &str {
        if self.module.is_empty() {
            "root"
        } else {
            &self.module
        }
    }
}

/// Builds units: index 0 is the root, then the wrapped modules in pre-order.
pub fn build_units(model: &Model, wrapped: &[Vec<String>], opts: &Options) -> Result<Vec<Unit>, PlanError> {
    let tree = Tree::new(model);
    let ws = opts.shard_size();
    let nm = model.modules.len();
    // The unit rooted at each module (by module index), if any.
    let mut unit_at: Vec<Option<usize>> = vec![None; nm];
    // each unit's modules (one; a unit group's several, in forward order)
    let mut unit_modules: Vec<Vec<usize>> = vec![vec![tree.index.get("").copied().unwrap_or(0)]];
    if let Some(&r) = tree.index.get("") {
        unit_at[r] = Some(0);
    }
    for (k, g) in wrapped.iter().enumerate() {
        let ms: Vec<usize> = g.iter().map(|p| tree.index[p.as_str()]).collect();
        for &mi in &ms {
            unit_at[mi] = Some(k + 1);
        }
        unit_modules.push(ms);
    }
    // Innermost unit covering each module (pre-order: parents come first).
    let mut parent: Vec<Option<usize>> = vec![None; nm];
    for (i, cs) in tree.children.iter().enumerate() {
        for &c in cs {
            parent[c] = Some(i);
        }
    }
    let mut cover = vec![0usize; nm];
    for i in 0..nm {
        cover[i] = match unit_at[i] {
            Some(u) => u,
            None => parent[i].map(|pi| cover[pi]).unwrap_or(0),
        };
    }
    let param_cover = |name: &str| -> usize {
        let module = name.rsplit_once('.').map(|x| x.0).unwrap_or("");
        tree.index.get(module).map(|&i| cover[i]).unwrap_or(0)
    };
    // Tied aliases must be covered by one unit.
    let mut names_by_primary: HashMap<&str, Vec<&str>> = HashMap::default();
    for p in model.params.iter().filter(|p| p.tied_to.is_some()) {
        names_by_primary.insert(model.primary_of(&p.name), vec![]);
    }
    if !names_by_primary.is_empty() {
        for p in &model.params {
            if let Some(v) = names_by_primary.get_mut(model.primary_of(&p.name)) {
                v.push(&p.name);
            }
        }
    }
    for names in names_by_primary.values() {
        let mut us: Vec<usize> = names.iter().map(|n| param_cover(n)).collect();
        us.sort_unstable();
        us.dedup();
        if us.len() > 1 {
            let labels: Vec<String> = us
                .iter()
                .map(|&u| if u == 0 { "root".to_string() } else { wrapped[u - 1].join(" + ") })
                .collect();
            return Err(PlanError::TiedAcrossUnits {
                policy: opts.policy.to_string(),
                param: names.join(" = "),
                units: labels.join(", "),
            });
        }
    }
    let mut direct: Vec<Vec<&fsdp_ir::Param>> = vec![Vec::new(); nm];
    for p in &model.params {
        if let Some(&i) = tree.index.get(p.module()) {
            direct[i].push(p);
        }
    }
    let float8 = if opts.float8.is_some() { crate::float8::float8_weights(model) } else { Default::default() };
    let mut units = Vec::with_capacity(unit_modules.len());
    let mut order = Vec::new();
    for (u, ms) in unit_modules.iter().enumerate() {
        // Module order: post-order DFS (fsdp2) or pre-order (flat), stopping at nested units;
        // a group's modules one after the other
        order.clear();
        for &mi in ms {
            collect(&tree, mi, u, &unit_at, opts.layout, &mut order);
        }
        let mi = ms[0];
        let mut seen: HashMap<&str, usize> = HashMap::default();
        let mut params: Vec<UnitParam> = Vec::new();
        for &m in &order {
            for &q in &direct[m] {
                let name = q.name.as_str();
                let prim = model.primary_of(name);
                if let Some(&k) = seen.get(prim) {
                    if name != params[k].name {
                        params[k].aliases.push(name.to_string());
                    }
                    continue;
                }
                let Some(p) = (if prim == name { Some(q) } else { model.param(prim) }) else {
                    continue;
                };
                seen.insert(prim, params.len());
                let mut up = UnitParam {
                    name: prim.to_string(),
                    aliases: vec![],
                    shape: p.shape.clone(),
                    dtype: p.dtype,
                    requires_grad: p.requires_grad,
                    numel: p.numel(),
                    padded_numel: 0,
                    shard_numel: 0,
                    offset: 0,
                    float8: float8.contains(prim),
                    shard_dim: 0,
                };
                if name != prim {
                    up.aliases.push(name.to_string());
                }
                params.push(up);
            }
        }
        for p in &mut params {
            if !p.aliases.is_empty() {
                p.aliases.retain(|a| a != &p.name);
                p.aliases.sort();
                p.aliases.dedup();
            }
        }
        let module = &model.modules[mi];
        let mut unit = Unit {
            id: UnitId::new(u),
            module: module.path.clone(),
            group: ms[1..].iter().map(|&m| model.modules[m].path.clone()).collect(),
            // (a unit of unlike modules, `model.norm+lm_head`: their classes, `LlamaRMSNorm+Linear`)
            class: {
                let mut classes: Vec<&str> = vec![];
                for &m in ms {
                    if !classes.contains(&model.modules[m].class.as_str()) {
                        classes.push(&model.modules[m].class);
                    }
                }
                classes.join("+")
            },
            params,
            numel: 0,
            padded_numel: 0,
            shard_numel: 0,
            grad_padded_numel: 0,
            reshard_after_forward: true,
            reshard_to: None,
            dtype: DType::Float32,
        };
        shard_dims(&mut unit, opts)?;
        layout(&mut unit, ws, opts.layout);
        units.push(unit);
    }
    if let Some((pat, d)) = opts.shard_dims.iter().find(|(pat, _)| !units.iter().flat_map(|u| &u.params).any(|p| std::iter::once(&p.name).chain(&p.aliases).any(|n| crate::wrap::glob_match(pat, n)))) {
        return Err(crate::error::opt_err("--shard-dim", format!("{pat}={d}: the pattern names no parameter of {}", model.name)));
    }
    Ok(units)
}

/// Each param's shard dim from `--shard-dim` (the last matching pattern's): a dim the param
/// has, and one the shard group divides where the param takes a gradient — FSDP2's
/// reduce-scatter raises "Shard(dim) requires even sharding" otherwise.
fn shard_dims(u: &mut Unit, opts: &Options) -> Result<(), PlanError> {
    if opts.shard_dims.is_empty() {
        return Ok(());
    }
    let ws = opts.shard_size();
    for p in &mut u.params {
        let names: Vec<&String> = std::iter::once(&p.name).chain(&p.aliases).collect();
        let Some((pat, d)) = opts.shard_dims.iter().rev().find(|(pat, _)| names.iter().any(|n| crate::wrap::glob_match(pat, n))) else { continue };
        let err = |why: String| Err(crate::error::opt_err("--shard-dim", format!("{pat}={d}: `{}` {why}", p.name)));
        let Some(&len) = p.shape.get(*d as usize) else {
            return err(format!("has {} dims ({:?}): no dim {d}", p.shape.len(), p.shape));
        };
        if *d > 0 && p.requires_grad && ws > 1 && len % ws != 0 {
            return err(format!("is {len} long on dim {d}, which the shard group of {ws} does not divide: FSDP2 shards dims other than 0 evenly only (its reduce-scatter raises \"Shard({d}) requires even sharding\")"));
        }
        p.shard_dim = *d;
    }
    Ok(())
}

fn collect(tree: &Tree, m: usize, unit: usize, unit_at: &[Option<usize>], layout: Layout, out: &mut Vec<usize>) {
    if let Some(u) = unit_at[m] {
        if u != unit {
            return;
        }
    }
    if layout == Layout::Flat {
        out.push(m);
    }
    for &c in &tree.children[m] {
        collect(tree, c, unit, unit_at, layout, out);
    }
    if layout == Layout::Fsdp2 {
        out.push(m);
    }
}

/// Shard layout of one unit over `ws` ranks.
fn layout(u: &mut Unit, ws: u64, layout: Layout) {
    let dtypes: Vec<DType> = u.params.iter().map(|p| p.dtype).collect();
    u.dtype = match dtypes.first() {
        Some(&d) if dtypes.iter().all(|&x| x == d) => d,
        Some(_) => DType::Uint8,
        None => DType::Float32,
    };
    u.numel = u.params.iter().map(|p| p.numel).sum();
    match layout {
        Layout::Fsdp2 => {
            let mut off = 0;
            for p in &mut u.params {
                let (d0, rest) = p.shard_split();
                let c = d0.div_ceil(ws);
                p.shard_numel = c * rest;
                p.padded_numel = c * ws * rest;
                p.offset = off;
                off += p.shard_numel;
            }
            u.shard_numel = off;
            u.padded_numel = off * ws;
            u.grad_padded_numel = u.params.iter().filter(|p| p.requires_grad).map(|p| p.padded_numel).sum();
        }
        Layout::Flat => {
            let mut off = 0;
            for p in &mut u.params {
                p.offset = off;
                p.padded_numel = p.numel;
                off += p.numel;
            }
            let c = off.div_ceil(ws);
            u.shard_numel = c;
            u.padded_numel = c * ws;
            u.grad_padded_numel = u.padded_numel;
        }
    }
}

/// Parameters whose dim 0 is shorter than the shard group, alike ones together (block
/// indices folded: `model.layers.*.mlp.experts.gate_up_proj`): FSDP2 shards on dim 0
/// (`Shard(0)`), so every rank holds ⌈d0 / N⌉ whole rows — ranks past d0 padding only — where
/// an even split would hold 1/N (MoE experts stacked on dim 0 over more ranks than experts
/// hold 1/8 of them on every rank at any N ≥ 8 for Mixtral's eight).
#[derive(Debug, Clone, PartialEq)]
pub struct ShortDim0 {
    pub pattern: String,
    pub shape: Vec<u64>,
    pub count: usize,
    /// Bytes one rank holds of them beyond an even 1/N split.
    pub extra_bytes: u64,
}

/// A param name with its numbered components as `*` (`model.layers.3.mlp.experts.down_proj` →
/// `model.layers.*.mlp.experts.down_proj`): the pattern of its like params in every block.
pub fn index_pattern(name: &str) -> String {
    name.split('.').map(|c| if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) { "*" } else { c }).collect::<Vec<_>>().join(".")
}

/// The [`ShortDim0`] groups of an FSDP2 layout over a shard group of `n` ranks, most extra
/// bytes first (none under the flat layout: FSDP1 pads the unit's flat parameter as a whole).
pub fn short_dim0(units: &[Unit], opts: &Options) -> Vec<ShortDim0> {
    let n = opts.shard_size();
    if opts.layout != Layout::Fsdp2 || n <= 1 {
        return vec![];
    }
    let mut groups: Vec<ShortDim0> = vec![];
    for p in units.iter().flat_map(|u| &u.params) {
        let d0 = p.shape.first().copied().unwrap_or(1);
        if d0 >= n || p.shard_dim != 0 {
            continue;
        }
        let extra = (p.shard_numel * n).saturating_sub(p.numel) / n * p.dtype.size();
        let pattern = index_pattern(&p.name);
        match groups.iter_mut().find(|g| g.pattern == pattern && g.shape == p.shape) {
            Some(g) => {
                g.count += 1;
                g.extra_bytes += extra;
            }
            None => groups.push(ShortDim0 { pattern, shape: p.shape.clone(), count: 1, extra_bytes: extra }),
        }
    }
    groups.sort_by(|a, b| b.extra_bytes.cmp(&a.extra_bytes).then(a.pattern.cmp(&b.pattern)));
    groups
}
