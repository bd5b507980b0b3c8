//! What each forward op allocates, what autograd saves for its backward, and what its
//! backward allocates, for HF transformers 5.17.0 on torch 2.11.0.
//!
//! Sizes come from the op's shapes, the compute dtype and the attention implementation.
//! Each rule names the HF/ATen code path it models. The schedule pass turns these specs
//! into buffer lifetimes; FSDPMemTracker's "Activation" and "Temp" are what they sum to.

use crate::options::{AttnImpl, Device};
use fsdp_ir::{numel, Act, DType, Dims, Model, Op, OpKind};
use rustc_hash::FxHashMap as HashMap;

/// One tensor: element count and dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct T {
    pub numel: u64,
    pub dtype: DType,
    /// Why it exists (printed in schedules and buffer tables).
    pub what: &'static str,
}

impl T {
    pub fn bytes(&self) -> u64 {
        self.numel * self.dtype.size()
    }
}

/// The memory behaviour of one op.
#[derive(Debug, Clone, Default)]
pub struct OpMem {
    /// The output; `None` when the output is the input itself (dropout with p = 0).
    pub out: Option<T>,
    /// Which inputs autograd saves for backward (keeps them alive until this op's backward).
    pub saves_inputs: Vec<bool>,
    /// The output is saved for backward.
    pub saves_output: bool,
    /// Tensors made inside the op and saved for backward (mean/rstd, masks, probs…).
    pub saved: Vec<T>,
    /// Tensors made and dropped inside the forward (live only during this op).
    pub fwd_scratch: Vec<T>,
    /// `fwd_scratch` is alive together (locals of one function), not one after the other.
    pub fwd_scratch_together: bool,
    /// Tensors made and dropped inside the backward (live only during its backward).
    pub bwd_scratch: Vec<T>,
    /// Does the output require grad (depends on params / inputs)?
    pub differentiable: bool,
    /// `bwd_scratch` is alive together and freed before the input grads are allocated
    /// (e.g. the loss under mixed precision: two f32 grads, then the low-precision cast).
    pub bwd_scratch_first: bool,
    /// The first this many of `saved` belong to the autograd node the op's backward runs
    /// first: they are released as soon as that node has made its grad (the first of
    /// `bwd_scratch`), before the next node's (the loss: nll_loss's target and total weight go
    /// before log_softmax's backward runs). Without `bwd_scratch` they go before the op's
    /// grads are made (a composite op whose nodes release their saved tensors one by one).
    pub first_node_saved: usize,
    /// A composite op's backward, node by node in the order autograd runs them (empty: the
    /// generic model of `bwd_scratch` / `first_node_saved`). What its nodes make, drop and
    /// release decides where inside the op the peak falls (a MoE layer's experts).
    pub bwd_chain: Vec<Step>,
    /// A forward that makes and drops tensors before and around its output ([`Step::Output`]
    /// places it; empty: the output first, then `fwd_scratch`): a float8 linear's casts.
    pub fwd_chain: Vec<Step>,
    /// The last this many of `saved` are copies of the op's inputs made before its kernel
    /// (SDPA's repeat_kv keys and values, its float mask), not outputs of the kernel:
    /// op-level SAC, which caches the kernel's outputs, recomputes them.
    pub input_copies: usize,
    /// The output is a copy of the kernel's output the op saves (Phi-3's partial-rotary SDPA:
    /// `transpose(1, 2).contiguous()` of a [b, h, s, d] output): op-level SAC, which caches the
    /// kernel's outputs, does not keep it, and makes it again in the recompute.
    pub out_copy: bool,
}

/// One step of a composite op's backward ([`OpMem::bwd_chain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A node makes a tensor: a grad passed down the chain, or a kernel's temporary.
    Make(T),
    /// The `k`-th tensor `Make` made is dropped.
    Drop(usize),
    /// `saved[k]` is released: its last saving node has run.
    Release(usize),
    /// In a checkpointed region only, `saved[k]` is released where the node's apply returns,
    /// before the engine's `validate_outputs` casts or sums its grads: checkpoint's unpack
    /// hook handed it over (the recompute's store lets go), and the apply's local held the
    /// last reference. Elsewhere the node's saved variable keeps it to [`Step::Release`].
    ReleaseUnpacked(usize),
    /// The node that got the op's output grad has run: that grad is dropped (its last use).
    DropOutGrad,
    /// The grad of the op's input at position `k` is made.
    InputGrad(usize),
    /// The grad of the op's `k`-th param is made.
    ParamGrad(usize),
    /// (forward chains) The op's output is made.
    Output,
    /// The op's node that saved its input at position `k` (as a view) has run: the op no
    /// longer holds that input (freed when nobody else does).
    ReleaseInput(usize),
    /// `made[k]` is one of the grads of the op's input at position `p`, passed on now if that
    /// input already has a grad (autograd's input buffer adds it in: `old + new`, out of
    /// place), else kept for [`Step::SumInto`].
    Deliver(usize, usize),
    /// The input at position `p`'s grads `made[a]` and `made[b]` end: where `a` was delivered,
    /// `b` is added into the input's grad; otherwise they are summed into a new tensor (`T`),
    /// which becomes the input's grad.
    SumInto(usize, usize, usize, T),
    /// (forward chains) A tensor made by an op torchtitan's op-level SAC keeps (`abs`, `max`:
    /// a float8 cast's amax): in a selective-op region it stays from the forward until the
    /// recompute, which takes it instead of making it again. Elsewhere a plain `Make`.
    MakeSaved(T),
}

/// Builds a [`OpMem::bwd_chain`], a method per [`Step`]: `make` returns the index `drop` takes.
#[derive(Default)]
struct Chain {
    steps: Vec<Step>,
    made: usize,
}

impl Chain {
    fn make(&mut self, t: T) -> usize {
        self.made_by(Step::Make(t))
    }
    fn make_saved(&mut self, t: T) -> usize {
        self.made_by(Step::MakeSaved(t))
    }
    fn made_by(&mut self, step: Step) -> usize {
        self.steps.push(step);
        self.made += 1;
        self.made - 1
    }
    fn drop(&mut self, k: usize) {
        self.steps.push(Step::Drop(k));
    }
    fn release(&mut self, k: usize) {
        self.steps.push(Step::Release(k));
    }
    fn release_unpacked(&mut self, k: usize) {
        self.steps.push(Step::ReleaseUnpacked(k));
    }
    fn drop_out_grad(&mut self) {
        self.steps.push(Step::DropOutGrad);
    }
    fn input_grad(&mut self, k: usize) {
        self.steps.push(Step::InputGrad(k));
    }
    fn param_grad(&mut self, k: usize) {
        self.steps.push(Step::ParamGrad(k));
    }
    fn release_input(&mut self, k: usize) {
        self.steps.push(Step::ReleaseInput(k));
    }

    /// torchao's `hp_tensor_to_float8_dynamic` of `n` elements of `d`, as eager runs it, with
    /// one scale (tensorwise, `k` = 1) or `k` (rowwise: per row or column): `amax` of
    /// `abs(x)`; `amax_to_scale` in float64 (`to`, `clamp`, `reciprocal`, `mul`, then
    /// `to(f32)`: the scale; rowwise rounds it down to a power of 2: `log2`, `floor`, `exp2`);
    /// `_ToFloat8ConstrFunc`: `x.to(f32) * scale`, `clamp` (to_fp8_saturated), `to(float8)`.
    /// The float8 data and the scale stay made (the caller's forward or backward holds them
    /// until it returns).
    fn float8_cast(&mut self, n: u64, d: DType, k: u64, pow2: bool) {
        let (f32_, f64_) = (DType::Float32, DType::Int64); // (8-byte elements)
        let a = self.make_saved(t(n, d, "float8 cast abs"));
        // (tensorwise: `max`, which SAC keeps; rowwise: `amax`, which it does not)
        let amax = if pow2 { self.make(t(k, d, "float8 amax")) } else { self.make_saved(t(k, d, "float8 amax")) };
        self.drop(a);
        let a64 = self.make(t(k, f64_, "float8 amax (float64)"));
        let c64 = self.make(t(k, f64_, "float8 clamped amax (float64)"));
        let r64 = self.make(t(k, f64_, "float8 reciprocal (float64)"));
        let s64 = self.make(t(k, f64_, "float8 scale (float64)"));
        self.drop(r64);
        self.drop(c64);
        let scale = self.make(t(k, f32_, "float8 scale"));
        self.drop(s64);
        if pow2 {
            let l = self.make(t(k, f32_, "float8 scale log2"));
            let fl = self.make(t(k, f32_, "float8 scale floor"));
            self.drop(l);
            self.make(t(k, f32_, "float8 scale (power of 2)"));
            self.drop(fl);
            self.drop(scale);
        }
        self.drop(a64);
        self.drop(amax);
        let up = (d != f32_).then(|| self.make(t(n, f32_, "float8 cast upcast")));
        let scaled = self.make(t(n, f32_, "float8 cast scaled"));
        if let Some(u) = up {
            self.drop(u);
        }
        let clamped = self.make(t(n, f32_, "float8 cast clamped"));
        self.make(t(n, DType::Float8E4m3fn, "float8 data"));
        self.drop(clamped);
        self.drop(scaled);
    }

    /// `torch._scaled_mm` of `[m, ·] @ [·, n]` into `out` (an output in `od`, the linear's
    /// dtype), with its inverse scales: tensorwise two scalars; rowwise `m` and `n` of them,
    /// and without fast accumulation (`post`) their outer product `[m, n]` (f32) applied to
    /// the output in place, the kernel itself called with unit scalar scales. A float32 linear
    /// gets the rowwise GEMM's bfloat16 output cast back.
    fn scaled_mm(&mut self, out: Step, m: u64, n: u64, od: DType, rowwise: bool, post: bool) -> Option<usize> {
        let f32_ = DType::Float32;
        if !rowwise {
            let r1 = self.make(t(1, f32_, "float8 inverse scale"));
            let r2 = self.make(t(1, f32_, "float8 inverse scale"));
            let o = self.emit(out);
            self.drop(r1);
            self.drop(r2);
            return o;
        }
        let mut ai = self.make(t(m, f32_, "float8 inverse scales"));
        let mut bi = self.make(t(n, f32_, "float8 inverse scales"));
        let mut outer = None;
        if post {
            outer = Some(self.make(t(m * n, f32_, "float8 scales' outer product")));
            let one = self.make(t(1, f32_, "float8 unit scale"));
            self.drop(ai);
            ai = one;
            let one = self.make(t(1, f32_, "float8 unit scale"));
            self.drop(bi);
            bi = one;
        }
        let o = if od == f32_ {
            let bf = self.make(t(m * n, DType::Bfloat16, "float8 GEMM output (bfloat16)"));
            let o = self.emit(out);
            self.drop(bf);
            o
        } else {
            self.emit(out)
        };
        if let Some(x) = outer {
            self.drop(x);
        }
        self.drop(ai);
        self.drop(bi);
        o
    }

    /// Pushes `step`; a `Make`'s index for [`Chain::drop`].
    fn emit(&mut self, step: Step) -> Option<usize> {
        match step {
            Step::Make(x) => Some(self.make(x)),
            s => {
                self.steps.push(s);
                None
            }
        }
    }
}

/// A torchao `Float8Linear` ([`crate::float8`]) of `x = rows·i` input, `w = o·i` weight and
/// `g = rows·o` output elements in `cd`: the forward casts the input (and the weight, unless it
/// was gathered in float8) before `_scaled_mm`; the backward casts the output's grad, the
/// weight (unless gathered in float8), the grad again and the saved input, and copies the
/// operands `_scaled_mm` wants in the other layout (the weight for the input's grad; the grad
/// and the input for the weight's grad). Every cast's float8 data and scale live until the
/// forward / backward returns (torchao float8_linear.py, float8_ops.py @0.18.0). Rowwise
/// scales: the input's and the grad's per row for the input's grad, the weight's per output
/// column (forward) and per input row (backward), the grad's and input's per column for the
/// weight's grad. With a bias, `Float8Linear.forward` adds it to the GEMM's result (`output +
/// bias`): a new output, the GEMM's dropped; its backward (the add's node, first) makes the
/// bias's grad.
fn float8_linear(m: &mut OpMem, cd: DType, rows: u64, i: u64, o: u64, f8: crate::options::Float8, bias: bool) {
    let f8d = DType::Float8E4m3fn;
    let row = f8.recipe == crate::options::Float8Recipe::Rowwise;
    let gathered = f8.all_gather;
    let (x, w, g) = (rows * i, o * i, rows * o);
    let k = |n: u64| if row { n } else { 1 };
    let mut f = Chain::default();
    f.float8_cast(x, cd, k(rows), row);
    if !gathered {
        f.float8_cast(w, cd, k(o), row);
    }
    if bias {
        let mm = f.scaled_mm(Step::Make(t(g, cd, F8_GEMM_RESULT)), rows, o, cd, row, false);
        f.steps.push(Step::Output);
        if let Some(x) = mm {
            f.drop(x);
        }
    } else {
        f.scaled_mm(Step::Output, rows, o, cd, row, false);
    }
    m.fwd_chain = f.steps;
    let mut b = Chain::default();
    if bias {
        b.param_grad(1);
    }
    b.float8_cast(g, cd, k(rows), row);
    if !gathered {
        b.float8_cast(w, cd, k(i), row);
    }
    let wc = b.make(t(w, f8d, "float8 weight column-major copy"));
    let gx = b.scaled_mm(Step::Make(t(x, cd, "float8 input grad")), rows, i, cd, row, true);
    b.drop(wc);
    b.float8_cast(g, cd, k(o), row);
    b.float8_cast(x, cd, k(i), row);
    let gc = b.make(t(g, f8d, "float8 grad row-major copy"));
    let xc = b.make(t(x, f8d, "float8 input column-major copy"));
    b.scaled_mm(Step::ParamGrad(0), o, i, cd, row, true);
    b.drop(gc);
    b.drop(xc);
    // (the Function returns both grads: the input's is handed on, added into an earlier one
    // of the same input, as the node returns — it is alive through the weight's grad)
    if let Some(gx) = gx {
        b.drop(gx);
    }
    b.input_grad(0);
    m.bwd_chain = b.steps;
}

/// What a float8 linear with a bias makes of its GEMM before adding the bias ([`float8_linear`]):
/// the tensor op-level SAC's cache keeps (the `mm` output).
pub const F8_GEMM_RESULT: &str = "float8 GEMM result";

/// Context shared by all ops of a step.
pub struct Ctx<'a> {
    pub model: &'a Model,
    pub dims: Dims,
    /// Compute dtype of activations (param_dtype under mixed precision).
    pub cd: DType,
    pub attn: AttnImpl,
    pub device: Device,
    /// FSDP2 casts each unit's floating-point forward inputs to this (MixedPrecisionPolicy's
    /// `cast_forward_inputs` with a `param_dtype`).
    pub input_cast: Option<DType>,
    /// `--float8`: its linears' casts ([`float8_linear`]).
    pub float8: Option<crate::options::Float8>,
    /// Modules that are FSDP units below the root (their forward inputs cast under
    /// `input_cast`); empty where the units are not known (the cost model's context).
    pub unit_modules: Vec<String>,
    /// HF's forward keeps a DynamicCache (no gradient checkpointing): attention reads k and v
    /// through the cache's copies (`torch.cat` onto the empty cache).
    pub use_cache: bool,
    /// The training loop's loss (`--train-loop`).
    pub train_loop: crate::options::TrainLoop,
    /// Each op's index by name, made on first use ([`Ctx::input_op`]).
    op_index: std::cell::OnceCell<HashMap<&'a str, usize>>,
}

impl<'a> Ctx<'a> {
    /// The context of a plan's step: activations in `param_dtype` under mixed precision,
    /// else in the model's parameter dtype.
    pub fn new(model: &'a Model, opts: &crate::options::Options, attn: AttnImpl) -> Ctx<'a> {
        Ctx {
            model,
            dims: Dims {
                batch: opts.batch,
                seq: opts.seq,
            },
            cd: compute_dtype(model, opts),
            attn,
            device: opts.device,
            input_cast: opts.param_dtype,
            float8: opts.float8,
            unit_modules: vec![],
            // (torchtitan's model, which `--compile` stands for, has no cache)
            use_cache: opts.checkpoint.is_empty() && !opts.compile,
            train_loop: opts.train_loop,
            op_index: std::cell::OnceCell::new(),
        }
    }

    /// Whether a sliding window of `window` masks this step's sequence: HF then builds an
    /// explicit mask (SDPA computes every tile under it), flash-attention skips tiles.
    pub fn window_masks(&self, window: Option<u64>) -> bool {
        window.is_some_and(|w| self.dims.seq > w)
    }

    /// The op that makes `op`'s `k`-th input (`None` for a model input).
    fn input_op(&self, op: &Op, k: usize) -> Option<&'a Op> {
        let name = op.inputs.get(k)?;
        let index = self.op_index.get_or_init(|| self.model.ops.iter().enumerate().map(|(i, o)| (o.name.as_str(), i)).collect());
        index.get(name.as_str()).map(|&i| &self.model.ops[i])
    }
}

/// The dtype activations are computed in: `param_dtype`, else the master dtype (the
/// parameters' own: `master_dtype`, else the model's floating-point parameter dtype).
pub fn compute_dtype(model: &Model, opts: &crate::options::Options) -> DType {
    opts.param_dtype.or(opts.master_dtype).unwrap_or_else(|| model.primary_params().map(|p| p.dtype).find(|d| d.is_float()).unwrap_or(DType::Float32))
}

fn t(numel: u64, dtype: DType, what: &'static str) -> T {
    T { numel, dtype, what }
}

impl Ctx<'_> {
    /// The elements one of the rotary tables (cos or sin, `[1, seq, head_dim]`) is counted
    /// as: the pair is one buffer, but two tensors, each in whole 512 B blocks on CUDA
    /// (measured on harness/fakegpu.py at seq 8).
    fn one_table(&self, head_dim: u64, d: DType) -> u64 {
        self.device.allocated_bytes(self.dims.seq * head_dim * d.size()) / d.size()
    }
    fn n(&self, op: &Op) -> u64 {
        numel(&op.shape, self.dims).unwrap_or(0)
    }
    pub fn tokens(&self) -> u64 {
        self.dims.batch * self.dims.seq
    }
    /// A dropout on `numel` elements: on CPU ATen's `_dropout` saves a noise tensor in the
    /// input dtype; CUDA's fused `native_dropout` saves a bool mask.
    fn dropout_mask(&self, numel: u64) -> T {
        match self.device {
            Device::Cpu => t(numel, self.cd, "dropout noise"),
            Device::Cuda => t(numel, DType::Bool, "dropout mask"),
        }
    }
}

/// The memory spec of `op` (its index in the model's op list is not needed).
pub fn op_mem(cx: &Ctx, op: &Op) -> OpMem {
    let cd = cx.cd;
    let n = cx.n(op);
    let ins = op.inputs.len();
    let out = Some(t(n, cd, "output"));
    let mut m = OpMem {
        out,
        saves_inputs: vec![false; ins],
        differentiable: true,
        ..OpMem::default()
    };
    match &op.kind {
        OpKind::Embedding | OpKind::PositionEmbedding => {
            // embedding(weight, ids) saves the ids; GPT-2 builds position ids (int64).
            m.saves_inputs = vec![true];
            if matches!(op.kind, OpKind::PositionEmbedding) {
                m.saved.push(t(cx.dims.seq, DType::Int64, "position ids"));
            }
        }
        OpKind::Linear { .. } => {
            // F.linear / addmm saves its input (and the weight, an unsharded param); so does
            // a Float8Linear (input_hp, weight_hp_t), around its casts
            m.saves_inputs = vec![true];
            let w = op.params.first().and_then(|p| cx.model.param(p)).map(|p| p.shape.as_slice());
            if let (OpKind::Linear { float32: true, .. }, Some(&[o, i])) = (&op.kind, w) {
                float32_linear(&mut m, cd, n / o.max(1), i, o);
                return m;
            }
            if let (Some(f8), Some(&[o, i]), OpKind::Linear { bias, .. }) = (cx.float8, w, &op.kind) {
                if crate::float8::is_float8_linear(cx.model, op) {
                    let rows = n / o.max(1);
                    float8_linear(&mut m, cd, rows, i, o, f8, *bias);
                }
            }
        }
        OpKind::LayerNorm { .. } => {
            // native_layer_norm saves input, mean and rstd ([tokens, 1]; input dtype on CPU, f32 on CUDA).
            m.saves_inputs = vec![true];
            let stat = if cx.device == Device::Cpu { cd } else { DType::Float32 };
            let rows = n / op.shape.last().and_then(|d| d.eval(cx.dims)).unwrap_or(1).max(1);
            m.saved.push(t(rows, stat, "layer_norm mean"));
            m.saved.push(t(rows, stat, "layer_norm rstd"));
            m.bwd_scratch.push(t(n, cd, "layer_norm grad scratch"));
        }
        OpKind::RmsNorm { head_dim, weight_f32, unit_offset, .. } => {
            // HF RMSNorm: x32 = x.to(f32); var = x32.pow(2).mean(-1); r = rsqrt(var + eps);
            // xn = x32 * r; out = weight * xn.to(dtype). Saved: x32 (x itself in f32), r, xn.
            // OLMo-2 (`weight_f32`): out = (weight * xn).to(dtype): xn is saved in f32 and the
            // f32 product is cast back. Per head (Qwen3's q/k norm), r has a row per head.
            let normed = head_dim.or_else(|| op.shape.last().and_then(|d| d.eval(cx.dims)));
            let rows = n / normed.unwrap_or(1).max(1);
            let f = DType::Float32;
            let upcast = cd != f;
            let late_cast = (*weight_f32 || *unit_offset) && upcast;
            // Gemma (`unit_offset`): out = (xn * (1 + weight.float())).type_as(x): the f32
            // `1 + weight` is made (from an f32 copy of a low-precision weight) and saved
            // Under MP, x32 is a new f32 copy and the low-precision input is not saved.
            m.saves_inputs = vec![!upcast];
            if upcast {
                m.saved.push(t(n, f, "rms_norm input upcast"));
            }
            let rsqrt = m.saved.len();
            m.saved.push(t(rows, f, "rms_norm rsqrt"));
            let xn = m.saved.len();
            m.saved.push(t(n, if late_cast { f } else { cd }, "rms_norm normalized"));
            m.fwd_scratch.push(t(n, f, "rms_norm x^2"));
            let offset = unit_offset.then(|| {
                let wn = normed.unwrap_or(1);
                if upcast {
                    m.fwd_scratch.push(t(wn, f, "rms_norm weight (f32)"));
                }
                m.saved.push(t(wn, f, "rms_norm 1+weight"));
                m.saved.len() - 1
            });
            if late_cast {
                m.fwd_scratch.push(t(n, f, "rms_norm weighted (f32)"));
            }
            // The backward, node by node (measured: Llama-3-70B's HSDP peak is in its pow node)
            let mut c = Chain::default();
            let a3 = if late_cast {
                // ToCopyBackward ((weight * xn).to(dtype)): the output's grad in f32
                let a0 = c.make(t(n, f, "rms_norm output grad (f32)"));
                c.drop_out_grad();
                // MulBackward0 (weight * xn, in f32): grad * xn (summed to the weight's
                // shape, cast to its dtype), grad * weight
                let a1 = c.make(t(n, f, "rms_norm weight grad product"));
                let a2 = c.make(t(n, f, "rms_norm normalized grad"));
                c.drop(a0);
                c.param_grad(0);
                c.drop(a1);
                c.release(xn);
                if let Some(w1) = offset {
                    c.release(w1);
                }
                a2
            } else {
                // MulBackward0 (weight * xn): grad * xn (summed to the weight's shape by
                // validate_outputs), grad * weight
                let a1 = c.make(t(n, cd, "rms_norm weight grad product"));
                let a2 = c.make(t(n, cd, "rms_norm normalized grad"));
                c.drop_out_grad();
                c.param_grad(0);
                c.drop(a1);
                c.release(xn);
                if let Some(w1) = offset {
                    c.release(w1);
                }
                // ToCopyBackward (xn.to(dtype)): back to f32
                if upcast {
                    let x = c.make(t(n, f, "rms_norm normalized grad (f32)"));
                    c.drop(a2);
                    x
                } else {
                    a2
                }
            };
            // MulBackward0 (x32 * r): grad * r, grad * x32 (summed to r's shape)
            let a4 = c.make(t(n, f, "rms_norm input grad (product)"));
            let a5 = c.make(t(n, f, "rms_norm rsqrt grad product"));
            c.drop(a3);
            let a6 = c.make(t(rows, f, "rms_norm rsqrt grad"));
            c.drop(a5);
            if !upcast {
                c.steps.push(Step::Deliver(0, a4));
            }
            // RsqrtBackward0 (saves its result), AddBackward0 (eps)
            let a7 = c.make(t(rows, f, "rms_norm variance grad"));
            c.drop(a6);
            c.release(rsqrt);
            // MeanBackward1: grad.expand(x) / h
            let a8 = c.make(t(n, f, "rms_norm mean grad"));
            c.drop(a7);
            // PowBackward0: grad * (2 * x32.pow(1)); the temporaries live to the expression's end
            let a9 = c.make(t(n, f, "rms_norm pow grad (x^1)"));
            let a10 = c.make(t(n, f, "rms_norm pow grad (2x)"));
            let a11 = c.make(t(n, f, "rms_norm pow grad"));
            c.drop(a9);
            c.drop(a10);
            c.drop(a8);
            if upcast {
                c.release(0);
            }
            // x32's two grads add up (out of place under a dispatch mode: the tracker's)
            if upcast {
                let a12 = c.make(t(n, f, "rms_norm input grad (f32)"));
                c.drop(a4);
                c.drop(a11);
                // ToCopyBackward (x.to(f32)): the input's grad in its dtype
                c.input_grad(0);
                c.drop(a12);
            } else {
                // (f32: x32 is the input itself, whose grads autograd adds up as they come —
                // into the residual stream's grad where the block's skip connection gave one
                // first: measured on harness/fsdp2_fake.py's per-op trace, tiny-llama-wide)
                c.steps.push(Step::SumInto(0, a4, a11, t(n, f, "rms_norm input grad (f32)")));
            }
            m.bwd_chain = c.steps;
        }
        OpKind::Add => {}
        OpKind::Mul => {
            m.saves_inputs = vec![true, true];
        }
        OpKind::Scale { buffer, .. } => {
            // By a Python number: nothing saved. Gemma's `x * embed_scale.to(weight.dtype)`:
            // MulBackward0 saves the scalar only (the input is not needed: the scalar takes no
            // grad); in a low-precision dtype the scalar is a new 0-dim copy of the float32
            // buffer
            if *buffer && cd != DType::Float32 {
                m.saved.push(t(1, cd, "scale scalar"));
            }
        }
        OpKind::Activation { act } => match act {
            Act::Silu | Act::Gelu | Act::Relu | Act::GeluPytorchTanh => {
                m.saves_inputs = vec![true];
            }
            Act::Tanh => {
                // TanhBackward0 keeps the result
                m.saves_output = true;
            }
            Act::GeluTanh => {
                // NewGELUActivation is Python: 0.5*x*(1+tanh(c*(x+0.044715*x^3))).
                // Saved: x (pow), tanh's result, (1+tanh), 0.5*x.
                m.saves_inputs = vec![true];
                m.saved.push(t(n, cd, "gelu tanh"));
                m.saved.push(t(n, cd, "gelu 1+tanh"));
                m.saved.push(t(n, cd, "gelu 0.5x"));
                m.fwd_scratch.push(t(n, cd, "gelu x^3"));
                m.fwd_scratch.push(t(n, cd, "gelu inner"));
                m.bwd_scratch.push(t(n, cd, "gelu grad scratch"));
                m.bwd_scratch.push(t(n, cd, "gelu grad scratch"));
            }
        },
        OpKind::Dropout { p } => {
            if *p > 0.0 {
                m.saved.push(cx.dropout_mask(n));
            } else {
                m.out = None;
            }
        }
        OpKind::RotaryEmbedding { head_dim, complex: true, .. } => {
            // DeepSeek-V2: polar(1, freqs) · attention_scaling, complex64 [1, seq, head_dim / 2]
            m.out = Some(t(cx.dims.seq * head_dim, DType::Float32, "rotary freqs_cis (complex64)"));
            m.differentiable = false;
            m.fwd_scratch.push(t(cx.dims.seq * head_dim, DType::Float32, "rotary freqs"));
        }
        OpKind::RotaryEmbedding { head_dim, f32_tables, .. } => {
            // cos and sin, [1, seq, head_dim] each, in the activation dtype (OLMo-2: float32);
            // no grad.
            let d = if *f32_tables { DType::Float32 } else { cd };
            m.out = Some(t(2 * cx.one_table(*head_dim, d), d, "rotary cos+sin"));
            m.differentiable = false;
            m.fwd_scratch.push(t(cx.dims.seq * head_dim, DType::Float32, "rotary freqs"));
        }
        OpKind::Rope { complex: true, .. } => {
            // DeepSeek-V2's apply_rotary_emb on a split view of q's or k's projection:
            // `view_as_complex(x.float().reshape(…, -1, 2)) * freqs_cis`, viewed as real, cast
            // back (`type_as`); MulBackward keeps the complex table (the rotary op's output).
            // In float32 the product is the output; else the float32 copy and the product
            // are made and dropped around the cast
            m.saves_inputs = vec![false, true];
            let f = DType::Float32;
            let mut c = Chain::default();
            if cd == f {
                // the grad's product with the table's conjugate: the input's grad (a piece)
                c.input_grad(0);
                c.drop_out_grad();
            } else {
                m.fwd_scratch_together = true;
                m.fwd_scratch.push(t(n, f, "rope input (f32)"));
                m.fwd_scratch.push(t(n, f, "rope complex product"));
                let g = c.make(t(n, f, "rope grad (f32)"));
                c.drop_out_grad();
                let p = c.make(t(n, f, "rope grad (complex product)"));
                c.drop(g);
                c.input_grad(0);
                c.drop(p);
            }
            m.bwd_chain = c.steps;
        }
        OpKind::Rope { interleave: true, .. } | OpKind::Rope { head_stride: Some(_), .. } => {
            // DeepSeek's rotary part of q or k (a split view of its projection):
            // apply_rotary_pos_emb_interleave's `cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin])`
            // on the even and odd slices; saves cos/sin (views of the shared tables)
            m.saves_inputs = vec![false, true];
            m.fwd_scratch.push(t(n, cd, "rope halves"));
            m.bwd_chain = interleaved_rope_backward(cd, n);
        }
        OpKind::Rope { head_dim, pass_through, .. } => {
            // (x*cos) + (rotate_half(x)*sin): saves cos/sin only (held by the rotary op).
            m.saves_inputs = vec![false, true];
            // float32 tables (OLMo-2) under mixed precision: each layer's FSDP2 forward-input
            // cast makes a low-precision copy of cos and sin, which the layer's RoPEs save
            // (counted with its first, `rope_q`); the float32 tables then live only as long
            // as the forward needs them
            let tables = cx.input_op(op, 1);
            let f32_tables = tables.is_some_and(|r| matches!(r.kind, OpKind::RotaryEmbedding { f32_tables: true, .. }));
            if f32_tables && cx.input_cast.is_some_and(|d| d != DType::Float32) {
                m.saves_inputs = vec![false, false];
                if op.name.ends_with("rope_q") {
                    m.saved.push(t(2 * cx.one_table(*head_dim, cd), cd, "rotary cos+sin (the layer's input cast)"));
                }
            }
            m.fwd_scratch.push(t(n, cd, "rope x*cos"));
            m.fwd_scratch.push(t(n, cd, "rope rotate_half"));
            m.fwd_scratch.push(t(n, cd, "rope rot*sin"));
            m.bwd_scratch.push(t(n, cd, "rope grad scratch"));
            m.bwd_scratch.push(t(n, cd, "rope grad scratch"));
            if *pass_through {
                // the rotated part is a slice of the input: its grad goes back through a
                // SliceBackward (zeros of the input's size, the grad copied in)
                m.bwd_scratch.push(t(n, cd, "rope rotated-part grad"));
            }
        }
        OpKind::GatedActivation { act } => {
            // Phi-3's MLP: gate, up = x.chunk(2); up * act(gate). The chunks are views of the
            // input, which act (gate) and the product (up) save; the product also saves act's
            // output. Backward: the product's two grads, act's backward, then SplitBackward's
            // cat of both halves' grads: the input's grad.
            m.saves_inputs = vec![true];
            let a = m.saved.len();
            m.saved.push(t(n, cd, "gated act output"));
            if matches!(act, Act::GeluTanh) {
                m.fwd_scratch.push(t(n, cd, "gated act scratch"));
            }
            let mut c = Chain::default();
            let up = c.make(t(n, cd, "gated up grad"));
            let ga = c.make(t(n, cd, "gated act grad"));
            c.drop_out_grad();
            c.release(a);
            let gg = c.make(t(n, cd, "gated gate grad"));
            c.drop(ga);
            c.input_grad(0);
            c.drop(gg);
            c.drop(up);
            m.bwd_chain = c.steps;
        }
        OpKind::Attention { heads, head_dim, mla: Some(mla), .. } => mla_attention(cx, &mut m, *heads, *head_dim, *mla),
        OpKind::Attention {
            heads,
            kv_heads,
            head_dim,
            dropout,
            sliding_window,
            ..
        } => {
            let masked = cx.window_masks(*sliding_window);
            attention(cx, op, &mut m, *heads, *kv_heads, *head_dim, *dropout, masked);
            // q from a partial-rotary RoPE (Phi-3) is `torch.cat`'s contiguous [b, h, s, d]: so
            // is the kernel's output, which SDPA saves, and the op's `transpose(1, 2)
            // .contiguous()` a copy of it (q in the projection's layout leaves both one tensor)
            let q_cat = cx.input_op(op, 0).is_some_and(|q| matches!(q.kind, OpKind::Rope { pass_through: true, .. }));
            if q_cat && cx.attn != AttnImpl::Eager && m.saves_output {
                m.saved.insert(0, t(n, cd, "attention output (b, h, s, d)"));
                m.first_node_saved += usize::from(m.first_node_saved > 0);
                m.out_copy = true;
            }
            // v a view of the fused projection (Phi-3): under the cache, what attention saves
            // is the cache's copy of v, not the projection the view keeps alive
            if let (OpKind::Attention { v_offset: Some(_), .. }, true) = (&op.kind, cx.use_cache) {
                if m.saves_inputs.get(2).copied().unwrap_or(false) {
                    m.saves_inputs[2] = false;
                    let at = m.saved.len() - m.input_copies;
                    m.saved.insert(at, t(n / heads.max(&1) * kv_heads, cd, "kv cache values (v copied)"));
                }
            }
            if let (OpKind::Attention { softcap: Some(_), .. }, AttnImpl::Eager) = (&op.kind, cx.attn) {
                softcap_scores(cx, &mut m, *heads);
            }
        }
        OpKind::Router { experts, top_k, normalize, sigmoid: Some(_), .. } => {
            // DeepseekV3TopkRouter after its float32 linear: sigmoid (SigmoidBackward keeps
            // its result), the biased scores' group-limited top-k (their nodes reach no loss:
            // freed with the forward's locals), the chosen scores gathered (GatherBackward
            // keeps the indices), `weights /= sum + 1e-20` in place (DivBackward keeps the
            // denominator and a clone of the weights) and `* routed_scaling_factor`
            // (measured: harness/saved_tensors.py on tiny-deepseek-v3)
            let (tok, f) = (cx.tokens(), DType::Float32);
            m.saves_inputs = vec![false];
            m.out = Some(t(tok * top_k, f, "router top-k weights"));
            m.saved.push(t(tok * experts, f, "router sigmoid scores"));
            m.saved.push(t(tok * top_k, DType::Int64, "router top-k indices"));
            if *normalize {
                m.saved.push(t(tok, f, "router top-k sum"));
                m.saved.push(t(tok * top_k, f, "router top-k weights (before the in-place division)"));
            }
            m.fwd_scratch.push(t(tok * experts, f, "router biased scores"));
            // (backward: [tokens, k] grads, then the gather's zeros [tokens, experts] and
            // sigmoid's grad of that size)
            m.bwd_scratch.push(t(tok * experts, f, "router gather grad"));
            m.bwd_scratch.push(t(tok * experts, f, "router sigmoid grad"));
        }
        OpKind::Router { experts, top_k, scaled: Some(sc), .. } => {
            // DeepseekV2TopkRouter after its float32 linear: softmax (its result kept),
            // group-limited: each group's best score (max: its node reaches no loss), the best
            // groups' mask (masked_fill keeps it), top-k (TopkBackward keeps the indices), the
            // weights times the scale (measured: harness/saved_tensors.py on tiny-deepseek-v2)
            let (tok, f) = (cx.tokens(), DType::Float32);
            m.saves_inputs = vec![false];
            m.out = Some(t(tok * top_k, f, "router top-k weights"));
            m.saved.push(t(tok * experts, f, "router probs"));
            if sc.groups.is_some() {
                m.saved.push(t(tok * experts, DType::Bool, "router group mask"));
            }
            m.saved.push(t(tok * top_k, DType::Int64, "router top-k indices"));
            m.bwd_scratch.push(t(tok * experts, f, "router top-k grad"));
            m.bwd_scratch.push(t(tok * experts, f, "router softmax grad"));
        }
        OpKind::Router { experts, top_k, normalize, cast, .. } => {
            // (the logits come from the gate's Linear op) softmax(logits.float()) saved; topk
            // values/indices; renormalized in place (Mixtral; Qwen3-MoE with norm_topk_prob);
            // Qwen3-MoE then casts the weights back to the logits' dtype.
            let tok = cx.tokens();
            let f = DType::Float32;
            m.saves_inputs = vec![false];
            let recast = *cast && cd != f;
            m.out = Some(t(tok * top_k, if recast { cd } else { f }, "router top-k weights"));
            m.saved.push(t(tok * experts, f, "router probs"));
            m.saved.push(t(tok * top_k, DType::Int64, "router top-k indices"));
            if *normalize {
                m.saved.push(t(tok, f, "router top-k sum"));
            }
            // the in-place renormalization's node keeps its float32 result until the router's
            // backward, after the experts': the output itself (Mixtral: the experts read it —
            // measured in fake mode, where the experts are a unit of their own, each layer's
            // weights alive through the experts' reduce-scatter), or the copy Qwen3-MoE casts
            // back from
            if *normalize && !recast {
                m.saves_output = true;
            }
            if *normalize && recast {
                m.saved.push(t(tok * top_k, f, "router top-k weights (f32)"));
            } else if recast {
                m.fwd_scratch.push(t(tok * top_k, f, "router top-k weights (f32)"));
            }
        }
        OpKind::Experts {
            top_k,
            intermediate,
            experts,
            ..
        } => {
            // transformers 5.17 "grouped_mm" experts (measured with harness/saved_tensors.py):
            // tokens sorted by expert, gathered, one gate_up and one down grouped matmul,
            // silu(gate)*up, scaled by the (float32) routing weight, scattered back, summed
            // over the top-k and cast back. Saved per layer: the gathered inputs, gate_up out,
            // silu, silu*up, down out, routing weights, the three int64 index vectors, the
            // sentinel mask and the expert offsets.
            let tok = cx.tokens();
            let routed = tok * top_k;
            let h = n / tok.max(1);
            let i = *intermediate;
            // the routing weights' dtype (float32, or the compute dtype when the router casts
            // them back: Qwen3-MoE) sets the dtype of the weighted outputs and their sum
            let router = cx.input_op(op, 1).map(|r| &r.kind);
            let router_casts = matches!(router, Some(OpKind::Router { cast: true, .. }));
            // experts that are an FSDP unit of their own get float32 routing weights cast to
            // the param dtype by the unit's pre-forward (a copy, alive during their forward)
            let unit_cast = !router_casts && cd != DType::Float32 && cx.input_cast == Some(cd) && cx.unit_modules.iter().any(|u| u == &op.module);
            if unit_cast {
                m.fwd_scratch.push(t(tok * top_k, cd, "routing weights (the unit's input cast)"));
            }
            let f = if router_casts || unit_cast { cd } else { DType::Float32 };
            // (the router's output, where a node keeps it — Mixtral's renormalized float32
            // weights — is kept by the router's own node, to its backward: `saves_output` there;
            // DeepSeek's scaled weights are a new product no node keeps)
            m.saves_inputs = vec![false, false];
            const INPUTS: usize = 0;
            const GATE_UP: usize = 1;
            const ACT: usize = 2;
            const ACT_UP: usize = 3;
            const DOWN: usize = 4;
            const WEIGHTS: usize = 5;
            const GATHER: usize = 6;
            const PERM: usize = 7;
            const INV_PERM: usize = 8;
            const MASK: usize = 9;
            const OFFSETS: usize = 10;
            m.saved = vec![
                t(routed * h, cd, "expert inputs"),
                t(routed * 2 * i, cd, "expert gate_up"),
                t(routed * i, cd, "expert act"),
                t(routed * i, cd, "expert act*up"),
                t(routed * h, cd, "expert down"),
                t(routed, f, "expert routing weights"),
                t(routed, DType::Int64, "expert gather index (perm // k)"),
                t(routed, DType::Int64, "expert sort permutation"),
                t(routed, DType::Int64, "expert inverse permutation"),
                t(routed, DType::Bool, "expert mask"),
                t(*experts, DType::Int32, "expert offsets"),
            ];
            // The backward, node by node as the engine runs them (measured: the peak of
            // tiny-mixtral under checkpointing is inside it, fp32 at the `act * up` node,
            // bf16 at the first index backward). A node's grads are made, its incoming
            // grad dropped when it returns, its saved tensors released after that.
            let mut c = Chain::default();
            // ToCopyBackward: the float32 sum's grad
            let g_sum = (cd != f).then(|| c.make(t(tok * h, f, "experts output grad (f32)")));
            // SumBackward expands (a view); ViewBackward's reshape of it copies
            let g1 = c.make(t(routed * h, f, "weighted grad (reshaped)"));
            if let Some(g) = g_sum {
                c.drop(g);
            }
            // IndexBackward (weighted_out[inv_perm]): new_zeros, then index_put out of place
            let z = c.make(t(routed * h, f, "index grad zeros"));
            let g2 = c.make(t(routed * h, f, "weighted grad"));
            c.drop(z);
            c.drop(g1);
            c.release(INV_PERM);
            // MulBackward0 (down * weights): grad*weights, grad*down; validate_outputs then
            // casts the first to down's dtype and sums the second to the weights' shape, each
            // replaced at once; the incoming grad goes when the node returns, and its saved
            // tensors then too — in a checkpointed region when its apply returns, before the
            // cast (DeepSeek's float32 weights times bf16 outputs on a GPU: the peak of tiny
            // DeepSeek-V2 there is the cast, exact in fake mode with and without AC)
            let a = c.make(t(routed * h, f, "down grad"));
            let p = c.make(t(routed * h, f, "routing weights grad (product)"));
            c.release_unpacked(DOWN);
            c.release_unpacked(WEIGHTS);
            let g3 = if cd != f {
                let x = c.make(t(routed * h, cd, "down grad (cast)"));
                c.drop(a);
                x
            } else {
                a
            };
            let gw = c.make(t(routed, f, "routing weights grad"));
            c.drop(p);
            c.drop(g2);
            c.release(DOWN);
            c.release(WEIGHTS);
            // MaskedFillBackward
            let g4 = c.make(t(routed * h, cd, "down grad (masked)"));
            c.drop(g3);
            // GroupedMmBackward (down): the input's grad, then the weight's (made in the
            // weight's layout: AccumulateGrad keeps it)
            let g5 = c.make(t(routed * i, cd, "act*up grad"));
            c.param_grad(1);
            c.drop(g4);
            c.release(ACT_UP);
            // MulBackward0 (act * up)
            let g6 = c.make(t(routed * i, cd, "act grad"));
            let g7 = c.make(t(routed * i, cd, "up grad"));
            c.drop(g5);
            c.release(ACT);
            // SiluBackward: gate_up's storage goes with its second view (gate)
            let g8 = c.make(t(routed * i, cd, "gate grad"));
            c.drop(g6);
            c.release(GATE_UP);
            // SplitBackward (chunk): cat
            let g9 = c.make(t(routed * 2 * i, cd, "gate_up grad"));
            c.drop(g8);
            c.drop(g7);
            // MaskedFillBackward
            let g10 = c.make(t(routed * 2 * i, cd, "gate_up grad (masked)"));
            c.drop(g9);
            // GroupedMmBackward (gate_up)
            let g11 = c.make(t(routed * h, cd, "expert inputs grad"));
            c.param_grad(0);
            c.drop(g10);
            c.release(INPUTS);
            c.release(OFFSETS);
            // MaskedFillBackward (the in-place pre-mask)
            let g12 = c.make(t(routed * h, cd, "expert inputs grad (masked)"));
            c.drop(g11);
            c.release(MASK);
            // IndexBackward (sample_weights[perm]), a later node than the gather's: the
            // top-k weights' grad
            let z = c.make(t(routed, f, "index grad zeros"));
            c.input_grad(1);
            c.drop(z);
            c.drop(gw);
            c.release(PERM);
            // IndexBackward (hidden_states[perm // k]): the hidden states' grad
            let z = c.make(t(tok * h, cd, "index grad zeros"));
            c.input_grad(0);
            c.drop(z);
            c.drop(g12);
            c.release(GATHER);
            m.bwd_chain = c.steps;
        }
        OpKind::CrossEntropy { vocab } => {
            // HF ForCausalLMLoss: logits.float(); labels padded and shifted (contiguous int64);
            // cross_entropy = log_softmax (saved, f32) + nll_loss (saves target, total_weight).
            let tok = cx.tokens();
            let logits = tok * vocab;
            m.out = Some(t(1, DType::Float32, "loss"));
            m.saves_inputs = vec![false, false];
            // (torchtitan-2024: cross_entropy on the float32 logits the loop holds — the
            // schedule makes and keeps them — and the loader's shifted labels, of which
            // nll_loss saves a view)
            let hf = cx.train_loop == crate::options::TrainLoop::Hf;
            if hf {
                let padded = cx.dims.batch * (cx.dims.seq + 1);
                if cx.dims.batch == 1 {
                    // one row: labels[..., 1:] is already contiguous, a view of the padded labels
                    m.saved.push(t(padded, DType::Int64, "padded labels (shifted view)"));
                } else {
                    m.saved.push(t(tok, DType::Int64, "shifted labels"));
                    m.fwd_scratch.push(t(padded, DType::Int64, "padded labels"));
                }
            }
            m.saved.push(t(1, DType::Float32, "nll total_weight"));
            m.first_node_saved = m.saved.len();
            m.saved.push(t(logits, DType::Float32, "log_softmax"));
            if hf && cd != DType::Float32 {
                m.fwd_scratch.push(t(logits, DType::Float32, "logits upcast"));
            }
            // ForCausalLMLoss's locals, alive through cross_entropy (measured: GPT-2 XL bf16,
            // batch 2, harness case `gpt2_xl_bf16_ws16`: FSDP2's peak is nll_loss's forward)
            m.fwd_scratch_together = hf;
            // nll_loss backward makes a zero-filled f32 [tokens, vocab] grad; log_softmax
            // backward makes another, which is the logits' grad in f32 and is cast under MP.
            m.bwd_scratch.push(t(logits, DType::Float32, "nll_loss grad"));
            if cd != DType::Float32 {
                m.bwd_scratch.push(t(logits, DType::Float32, "log_softmax grad"));
                m.bwd_scratch_first = true;
            }
        }
    }
    m
}

/// Point-wise and reduction ops inductor fuses (and its partitioner may recompute).
pub fn pointwise(o: &Op) -> bool {
    matches!(o.kind, OpKind::Activation { .. } | OpKind::Mul | OpKind::Add | OpKind::Rope { .. } | OpKind::RmsNorm { .. } | OpKind::Scale { .. } | OpKind::GatedActivation { .. })
}

/// The decoder blocks `--compile` compiles (module paths).
pub fn compiled_blocks(model: &Model) -> Vec<String> {
    model.modules.iter().filter(|m| m.class.ends_with("DecoderLayer") || m.class == "GPT2Block").map(|m| m.path.clone()).collect()
}

/// The compiled blocks whose memory [`compiled`] models: those made only of op kinds measured
/// under inductor's partitioner (tests/fixtures/fsdp2_compile/: Llama, Qwen2/3, Phi-3, OLMo-2
/// blocks, Mixtral's MoE). A block with anything else (LayerNorm, GELU, dropout, Gemma's
/// scaled norms and soft-capping, DeepSeek's and Qwen3-MoE's routers, DeepSeek's latent
/// attention, a sliding window that masks a `seq` long sequence) keeps eager's memory whole.
pub fn compiled_memory_blocks(model: &Model, seq: u64) -> Vec<String> {
    let (blocks, _, whole) = blocks_measured(model, seq);
    blocks.into_iter().zip(whole).filter_map(|(b, w)| w.then_some(b)).collect()
}

/// Which ops `--compile`'s memory model covers, each with its block (an index into
/// [`compiled_blocks`]): those inside a block of [`compiled_memory_blocks`] (torchtitan's
/// `apply_compile` compiles each block; the embedding, the final norm, the head and the loss
/// stay eager), not with eager attention.
/// (A float8 linear's: [`compiled_float8`] outside checkpointing, [`compiled_float8_sac`] under
/// op-level SAC; its casts' temporaries and a full-AC recompute keep eager's model.)
pub fn compiled_ops(cx: &Ctx, model: &Model) -> Vec<Option<usize>> {
    let (_, block_of, whole) = blocks_measured(model, cx.dims.seq);
    block_of.iter().map(|b| b.filter(|&b| cx.attn != AttnImpl::Eager && whole[b])).collect()
}

/// The compiled blocks, each op's (the innermost of them on its module path) and whether a
/// block is made only of [`measured`] ops.
fn blocks_measured(model: &Model, seq: u64) -> (Vec<String>, Vec<Option<usize>>, Vec<bool>) {
    let blocks = compiled_blocks(model);
    let index: HashMap<&str, usize> = blocks.iter().enumerate().map(|(i, b)| (b.as_str(), i)).collect();
    let of: Vec<Option<usize>> = model
        .ops
        .iter()
        .map(|o| {
            let mut path = Some(o.module.as_str());
            while let Some(p) = path {
                if let Some(&b) = index.get(p) {
                    return Some(b);
                }
                path = fsdp_ir::parent_path(p);
            }
            None
        })
        .collect();
    let mut whole = vec![true; blocks.len()];
    for (op, b) in model.ops.iter().zip(&of) {
        if let Some(b) = *b {
            whole[b] &= measured(op, seq);
        }
    }
    (blocks, of, whole)
}

/// An op kind measured under inductor's partitioner ([`compiled_memory_blocks`]).
fn measured(o: &Op, seq: u64) -> bool {
    match &o.kind {
        OpKind::RmsNorm { unit_offset, .. } => !unit_offset,
        OpKind::Rope { complex, interleave, head_stride, .. } => !complex && !interleave && head_stride.is_none(),
        OpKind::Attention { mla, softcap, sliding_window, dropout, .. } => mla.is_none() && softcap.is_none() && sliding_window.is_none_or(|w| seq <= w) && *dropout == 0.0,
        OpKind::Activation { act } | OpKind::GatedActivation { act } => matches!(act, Act::Silu),
        OpKind::Dropout { p } => *p == 0.0,
        OpKind::Linear { .. } | OpKind::Mul | OpKind::Add => true,
        // Mixtral's softmax router and the grouped_mm experts (tiny Mixtral, fake mode)
        OpKind::Router { sigmoid: None, scaled: None, cast: false, .. } => true,
        OpKind::Experts { act, .. } => matches!(act, Act::Silu),
        _ => false,
    }
}

/// Drops `saved`'s tensor named `what` (the partitioner recomputes it), and the backward
/// chain's releases of it; the others' indices follow.
fn unsave(m: &mut OpMem, what: &str) {
    let Some(k) = m.saved.iter().position(|x| x.what == what) else { return };
    m.saved.remove(k);
    m.bwd_chain.retain(|s| !matches!(*s, Step::Release(j) | Step::ReleaseUnpacked(j) if j == k));
    for s in &mut m.bwd_chain {
        match s {
            Step::Release(j) | Step::ReleaseUnpacked(j) if *j > k => *j -= 1,
            _ => {}
        }
    }
}

/// What a decoder block saves and makes under `torch.compile` (torchtitan's `--compile`),
/// in place of eager autograd's [`op_mem`]. Inductor's min-cut partitioner decides what the
/// forward saves: the outputs of ops it will not recompute (GEMMs, SDPA) that the backward
/// needs, and of the point-wise and reduction ops only what is cheaper to keep than to
/// recompute from those; the rest of each point-wise chain is recomputed inside the fused
/// backward kernels. Measured with inductor's own partition function (its joint-graph passes,
/// then `min_cut_rematerialization_partition`) under fake mode, harness
/// `fsdp2_oracle.compile_blocks`, `tests/fixtures/fsdp2_compile/` (what the forward leaves
/// for the backward, exact):
///
/// - RMSNorm keeps its input and the f32 `rsqrt` per row, nothing else (eager keeps an f32
///   copy of the input and the normalized tensor); its output is kept by the linear reading
///   it, as in eager;
/// - RoPE keeps nothing of its own (its outputs are SDPA's q and k);
/// - an activation keeps its input (the gate projection's output); a product keeps only
///   factors no point-wise op made (`up`: `silu(gate)` is recomputed from `gate`);
/// - a linear reading the attention's output keeps nothing of it when SDPA saves it (the
///   `transpose(1, 2).contiguous()` copy is recomputed from the kernel's output; with a
///   partial rotary's `cat`ed q, Phi-3's, SDPA keeps only the kernel's `[b, h, s, d]` output);
/// - Phi-3's fused SwiGLU keeps its input only;
/// - Mixtral's MoE: the router keeps the logits and top-k's values and indices (not the
///   softmax, the sum, the renormalized weights), the experts what eager's nodes keep but the
///   SiLU's output and the gathered routing weights (tiny Mixtral with and without AC).
///
/// The fused kernels make no temporaries of their own (forward or backward): inductor writes
/// each chain's outputs once. What the backward materializes beyond that (the fused kernels'
/// outputs under its memory planning) is eager's per-op model of the remaining ops, not
/// measured (the harness runs the partitioned graphs unfused).
///
/// In checkpointed blocks these rules are what the recompute makes (inductor's backward
/// recomputes inside its fused kernels); which SAC outputs the forward keeps is the
/// schedule's (`compiled_checkpoints`). `covered`: [`compiled_ops`].
pub fn compiled(cx: &Ctx, model: &Model, mems: &mut [OpMem], covered: &[Option<usize>]) {
    let index: HashMap<&str, usize> = model.ops.iter().enumerate().map(|(i, o)| (o.name.as_str(), i)).collect();
    let saves_output: Vec<bool> = mems.iter().map(|m| m.saves_output).collect();
    for (i, op) in model.ops.iter().enumerate() {
        if covered[i].is_none() {
            continue;
        }
        let m = &mut mems[i];
        match &op.kind {
            OpKind::RmsNorm { head_dim, .. } => {
                let normed = head_dim.or_else(|| op.shape.last().and_then(|d| d.eval(cx.dims)));
                let rows = cx.n(op) / normed.unwrap_or(1).max(1);
                *m = OpMem {
                    out: m.out,
                    saves_inputs: vec![true],
                    saved: vec![t(rows, DType::Float32, "rms_norm rsqrt")],
                    differentiable: m.differentiable,
                    ..OpMem::default()
                };
            }
            OpKind::Rope { complex: false, interleave: false, head_stride: None, .. } | OpKind::Activation { .. } | OpKind::Add => {
                m.fwd_scratch.clear();
                m.bwd_scratch.clear();
                m.bwd_chain.clear();
            }
            OpKind::Mul => {
                for k in 0..m.saves_inputs.len() {
                    if op.inputs.get(k).and_then(|n| index.get(n.as_str())).is_some_and(|&j| pointwise(&model.ops[j]) && covered[j].is_some()) {
                        m.saves_inputs[k] = false;
                    }
                }
                m.bwd_scratch.clear();
                m.bwd_chain.clear();
            }
            // (Phi-3's SwiGLU: `up * act(gate)` on the fused projection's halves; the
            // activation's output is recomputed from the gate)
            OpKind::GatedActivation { .. } => {
                m.saved.clear();
                m.fwd_scratch.clear();
                m.bwd_chain.clear();
            }
            // q from a partial rotary's `cat` (Phi-3): SDPA keeps the kernel's [b, h, s, d]
            // output; its `transpose(1, 2).contiguous()` copy, the op's output, is recomputed
            OpKind::Attention { .. } if m.saved.first().is_some_and(|t| t.what == "attention output (b, h, s, d)") => {
                m.saves_output = false;
            }
            OpKind::Linear { .. } => {
                if let Some(j) = op.inputs.first().and_then(|n| index.get(n.as_str())) {
                    if matches!(model.ops[*j].kind, OpKind::Attention { .. }) && saves_output[*j] {
                        m.saves_inputs = vec![false];
                    }
                }
            }
            // Mixtral's router keeps its input (the logits) and top-k's float32 values and
            // indices; the softmax, the top-k sum and the renormalized weights are recomputed
            OpKind::Router { top_k, .. } => {
                let tok = cx.tokens();
                m.saves_inputs = vec![true];
                m.saves_output = false;
                m.saved = vec![t(tok * top_k, DType::Float32, "router top-k values"), t(tok * top_k, DType::Int64, "router top-k indices")];
                m.fwd_scratch.clear();
            }
            // the experts keep what eager's nodes save but the SiLU's output (recomputed from
            // gate_up) and the gathered routing weights (from the router's top-k values)
            OpKind::Experts { .. } => {
                unsave(m, "expert act");
                unsave(m, "expert routing weights");
                m.fwd_scratch.clear();
            }
            _ => {}
        }
    }
}

/// The float8 linears of compiled blocks outside checkpointing (measured with inductor's
/// partition function in fake mode, `tests/fixtures/fsdp2_compile/`: tiny Llama, the three
/// recipes; Llama-3.1-8B's block, OLMo-2's and Phi-3's listed the same way). The forward keeps
/// no copy of a linear's input that a point-wise chain made (a norm's output, SwiGLU's
/// product; not the block's input, its graph's input): the backward recomputes the chain and
/// its float8 cast from what the chain keeps.
/// Tensorwise scales keep the weight's inverse scale (and, when the weight is cast in the
/// forward, its `amax`); rowwise keeps none. With the weights all-gathered in float8 the
/// partitioner's min cut ties between keeping the gathered weight (freed by FSDP after the
/// forward: free) and the transposed copy the input's grad needs (its bytes): it keeps the
/// copy of every weight but those whose output reaches RoPE (q, k, Phi-3's fused qkv) and
/// the attention's output projection, in Llama, OLMo-2 and Phi-3 blocks alike. `covered`: the
/// compiled ops outside checkpointed regions and their blocks ([`compiled_ops`]; under
/// op-level SAC [`compiled_float8_sac`]).
pub fn compiled_float8(cx: &Ctx, model: &Model, mems: &mut [OpMem], covered: &[Option<usize>]) {
    let Some(f8) = cx.float8 else { return };
    let index: HashMap<&str, usize> = model.ops.iter().enumerate().map(|(i, o)| (o.name.as_str(), i)).collect();
    let input_of = |o: &Op| o.inputs.first().and_then(|n| index.get(n.as_str())).copied();
    // ops whose output a RoPE reads, directly or through a norm (OLMo-2's q_norm / k_norm)
    let mut to_rope = vec![false; model.ops.len()];
    for op in model.ops.iter().filter(|o| matches!(o.kind, OpKind::Rope { .. })) {
        for j in op.inputs.iter().filter_map(|n| index.get(n.as_str()).copied()) {
            to_rope[j] = true;
            if matches!(model.ops[j].kind, OpKind::RmsNorm { .. }) {
                if let Some(k) = input_of(&model.ops[j]) {
                    to_rope[k] = true;
                }
            }
        }
    }
    for (i, op) in model.ops.iter().enumerate() {
        if covered[i].is_none() || !crate::float8::is_float8_linear(model, op) {
            continue;
        }
        let Some(&[o, w_in]) = op.params.first().and_then(|p| model.param(p)).map(|p| p.shape.as_slice()) else { continue };
        let input = input_of(op);
        let m = &mut mems[i];
        // (a block's input, the previous block's output, is its graph's input: always kept)
        if input.is_some_and(|j| covered[j] == covered[i] && pointwise(&model.ops[j])) {
            m.saves_inputs = vec![false];
        }
        if f8.recipe == crate::options::Float8Recipe::Tensorwise {
            if !f8.all_gather {
                m.saved.push(t(1, cx.cd, "float8 weight amax"));
            }
            m.saved.push(t(1, DType::Float32, "float8 weight inverse scale"));
        }
        let from_attention = input.is_some_and(|j| matches!(model.ops[j].kind, OpKind::Attention { .. }));
        if f8.all_gather && !to_rope[i] && !from_attention {
            m.saved.push(t(o * w_in, DType::Float8E4m3fn, "float8 weight transposed copy"));
        }
    }
}

/// A float8 linear's forward chain in a compiled block under op-level SAC (measured,
/// `tests/fixtures/fsdp2_compile/`, tensorwise): the partitioner keeps no cast's `abs` (the
/// policy's MUST_SAVE, but nothing in the backward reads it); a linear whose GEMM output the
/// forward keeps (`kept`: SAC's, read by the backward) also keeps its input cast's `amax` and
/// the GEMM's two inverse scales, the others none of them — but where the weight is cast in
/// the forward (not gathered in float8: `weight_cast`), every linear keeps that cast's `amax`,
/// which the backward's cast of the same weight reads (tiny-llama-wide, bf16: ten `max`
/// outputs a block, seven weights' and the three kept linears' inputs').
pub fn compiled_float8_sac(m: &mut OpMem, kept: bool, weight_cast: bool) {
    // (the forward casts the input, then the weight: the second amax is the weight's)
    let mut amax = 0;
    for step in &mut m.fwd_chain {
        *step = match *step {
            Step::MakeSaved(x) if x.what == "float8 amax" => {
                amax += 1;
                if kept || (weight_cast && amax == 2) {
                    Step::MakeSaved(x)
                } else {
                    Step::Make(x)
                }
            }
            Step::MakeSaved(x) => Step::Make(x),
            Step::Make(x) if kept && x.what == "float8 inverse scale" => Step::MakeSaved(x),
            s => s,
        };
    }
}

/// A linear computed in float32 (`F.linear(x.type(torch.float32), w.type(torch.float32))`,
/// DeepSeek-V3's router) of `rows·i` inputs and an `o·i` weight: under a lower-precision `cd`
/// the mm saves the float32 copies of both (the input's, and the weight's transposed), its
/// output is float32; the backward makes both grads in float32, then casts each back
/// (the weight's first: its cast node is the later one).
fn float32_linear(m: &mut OpMem, cd: DType, rows: u64, i: u64, o: u64) {
    let f = DType::Float32;
    m.out = Some(t(rows * o, f, "output (f32)"));
    if cd == f {
        return;
    }
    m.saves_inputs = vec![false];
    m.saved.push(t(rows * i, f, "input (f32 copy)"));
    m.saved.push(t(o * i, f, "weight (f32 copy)"));
    // (copies made before the kernel: op-level SAC caches the mm's output and makes them
    // again in the recompute — DeepSeek-V2-Lite under SAC on the fake GPU, FSDP2-exact in
    // fake mode, where keeping them was 67.6 MB a MoE block over)
    m.input_copies = 2;
    let mut c = Chain::default();
    let gi = c.make(t(rows * i, f, "input grad (f32)"));
    let gw = c.make(t(o * i, f, "weight grad (f32)"));
    c.drop_out_grad();
    c.release(0);
    c.release(1);
    c.param_grad(0);
    c.drop(gw);
    c.input_grad(0);
    c.drop(gi);
    m.bwd_chain = c.steps;
}

/// The backward of DeepSeek's interleaved RoPE over `n` elements, node by node: the four
/// products' grads (`n/2` each; the subtraction's negated grad), the two slices' grads summed
/// (out of place under the tracker's dispatch mode), each slice's SliceBackward (zeros of the
/// whole input with the grad copied in), their sum: the input's grad, a piece of the split
/// its projection's grad is joined from.
fn interleaved_rope_backward(cd: DType, n: u64) -> Vec<Step> {
    let h = n / 2;
    let mut c = Chain::default();
    // `x2 * cos + x1 * sin` (the later expression), then `x1 * cos - x2 * sin`
    let x1a = c.make(t(h, cd, "rope grad (x1 * sin)"));
    let x2a = c.make(t(h, cd, "rope grad (x2 * cos)"));
    let neg = c.make(t(h, cd, "rope grad (negated)"));
    let x2b = c.make(t(h, cd, "rope grad (x2 * sin)"));
    c.drop(neg);
    let x2 = c.make(t(h, cd, "rope grad (x2, summed)"));
    c.drop(x2a);
    c.drop(x2b);
    let x1b = c.make(t(h, cd, "rope grad (x1 * cos)"));
    let x1 = c.make(t(h, cd, "rope grad (x1, summed)"));
    c.drop_out_grad();
    c.drop(x1a);
    c.drop(x1b);
    // SliceBackward of x[..., 1::2], then of x[..., 0::2]
    let s2 = c.make(t(n, cd, "rope grad (odd slice)"));
    c.drop(x2);
    let s1 = c.make(t(n, cd, "rope grad (even slice)"));
    c.drop(x1);
    c.input_grad(0);
    c.drop(s1);
    c.drop(s2);
    c.steps
}

/// DeepSeek's multi-head latent attention ([`fsdp_ir::Mla`]) from its projections' outputs:
/// q = cat(q_pass, q_rot) and k = new_empty + copy_(k_nope) + copy_(k_rot expanded), v a
/// strided view of kv_b_proj's output. q/k heads are `dqk` wide, v heads `dv`: the CPU's
/// SDPA has no fused kernel for that (its flash kernel wants one head width) and runs its math
/// path (which upcasts half/bf16 to float32): q·sqrt(scale) and kᵀ·sqrt(scale), the probs
/// and a contiguous v saved; eager saves q, k, the float32 probs (and their cast) and a
/// contiguous v. On CUDA SDPA takes the memory-efficient kernel (q, k, v, its output and
/// log-sum-exp saved; not measured). The backward, node by node, ends in the latent part's:
/// k's two CopySlices (a whole copy of k's grad each, the slices cloned), the rotated key's
/// grad summed over the heads, and k_nope's with v's joined (SplitWithSizesBackward) and
/// reshaped: kv_b_proj's grad. q's grad is a piece of the split q_b_proj's grad is joined
/// from (schedule: `split_read`), the rotated q's a view of it.
fn mla_attention(cx: &Ctx, m: &mut OpMem, heads: u64, dqk: u64, mla: fsdp_ir::Mla) {
    let (cd, f) = (cx.cd, DType::Float32);
    let (b, s) = (cx.dims.batch, cx.dims.seq);
    let dr = dqk.saturating_sub(mla.nope);
    let q = b * heads * s * dqk;
    let v = b * heads * s * mla.v_head_dim;
    let p = b * heads * s * s;
    let sizes = MlaSizes { q, r: b * heads * s * dr, nope: b * heads * s * mla.nope, kv: b * heads * s * (mla.nope + mla.v_head_dim) };
    m.saves_inputs = vec![false; 4];
    m.out = Some(t(v, cd, "output"));
    let mut c = Chain::default();
    if cx.device == Device::Cuda && cx.attn != AttnImpl::Eager {
        // the memory-efficient kernel (q/k and v differ in width: no flash; measured on
        // harness/fakegpu.py, DeepSeek-V2-Lite): q, k, v (kv_b_proj's output, a view), its
        // output — written [b, s, h, d], so HF's transpose + contiguous is a view of it, the
        // op's output — a log-sum-exp padded to 32 rows and the philox seed and offset saved;
        // its backward makes the three grads
        // (q and k, cat and new_empty + copy_ of the projections, are copies of the op's
        // inputs made before the kernel: op-level SAC, which caches the kernel's outputs,
        // makes them again in the recompute — FSDP2-exact in fake mode on the fake GPU,
        // tiny DeepSeek-V2 and V3 with one block under SAC, where keeping them was 4,608 B over)
        m.saves_inputs[2] = true;
        m.saves_output = true;
        mla_qk_scratch(m, q, cd);
        m.saved.push(t(b * heads * s.div_ceil(32) * 32, f, "attention logsumexp"));
        m.saved.push(t(2, DType::Int64, "attention philox seed"));
        m.saved.push(t(1, DType::Int64, "attention philox offset"));
        m.saved.push(t(q, cd, "q"));
        m.saved.push(t(q, cd, "k"));
        m.input_copies = 2;
        let vg = c.make(t(v, cd, "attention v grad"));
        let kg = c.make(t(q, cd, "attention k grad"));
        c.input_grad(0);
        c.input_grad(1);
        c.drop_out_grad();
        for k in 0..m.saved.len() {
            c.release(k);
        }
        mla_backward_tail(&mut c, cd, kg, vg, sizes);
        m.bwd_chain = c.steps;
        return;
    }
    if cx.attn == AttnImpl::Eager {
        // matmul(q, kᵀ) · scaling (+ mask) -> softmax(f32) -> .to(dtype) -> matmul(probs, v)
        const Q: usize = 0;
        const K: usize = 1;
        const PROBS: usize = 2;
        const V: usize = 3;
        let cast = cd != f;
        m.saved.push(t(q, cd, "q (cat)"));
        m.saved.push(t(q, cd, "k (new_empty + copy_)"));
        m.saved.push(t(p, f, "attention probs"));
        // matmul(probs, v) folds v's batch and heads for bmm: a copy of the strided view,
        // but a view of kv_b_proj's output (kept whole) with one row
        if b == 1 {
            m.saves_inputs[2] = true;
            m.saved.push(t(0, cd, "attention v (a view)"));
        } else {
            m.saved.push(t(v, cd, "attention v (contiguous copy)"));
        }
        if cast {
            m.saved.push(t(p, cd, "attention probs cast"));
        }
        m.fwd_scratch.push(t(p, cd, "attention scores"));
        let g2 = c.make(t(v, cd, "attention output grad (bmm layout)"));
        let vg = c.make(t(v, cd, "attention v grad"));
        let pg = c.make(t(p, cd, "attention probs grad"));
        c.drop_out_grad();
        c.drop(g2);
        c.release(V);
        if b == 1 {
            c.release_input(2);
        }
        if cast {
            c.release(4);
        }
        let pg = if cast {
            let x = c.make(t(p, f, "attention probs grad (f32)"));
            c.drop(pg);
            x
        } else {
            pg
        };
        // softmax(·, dtype=float32): its grad in f32, then the upcast's ToCopyBackward
        let sg = c.make(t(p, f, "softmax grad"));
        c.drop(pg);
        c.release(PROBS);
        let sg = if cast {
            let x = c.make(t(p, cd, "softmax grad (cast)"));
            c.drop(sg);
            x
        } else {
            sg
        };
        let sg2 = c.make(t(p, cd, "scores grad (scaled)"));
        c.drop(sg);
        let kg = c.make(t(q, cd, "attention k grad"));
        c.input_grad(0);
        c.input_grad(1);
        c.drop(sg2);
        c.release(Q);
        c.release(K);
        mla_backward_tail(&mut c, cd, kg, vg, sizes);
        m.bwd_chain = c.steps;
        return;
    }
    // SDPA's math path (measured: harness/saved_tensors.py on tiny-deepseek-v3), in `w`
    const PROBS: usize = 0;
    const VC: usize = 1;
    const QS: usize = 2;
    const KS: usize = 3;
    let up = cd != f;
    let w = if up { f } else { cd };
    mla_qk_scratch(m, q, cd);
    m.saved.push(t(p, w, "attention probs"));
    m.saved.push(t(v, w, "attention v (contiguous copy)"));
    m.saved.push(t(q, w, "attention q scaled"));
    m.saved.push(t(q, w, "attention k scaled (transposed)"));
    if up {
        m.fwd_scratch.push(t(q, f, "q (f32)"));
        m.fwd_scratch.push(t(q, f, "k (f32)"));
    }
    m.fwd_scratch.push(t(p, w, "attention scores"));
    // the output's grad (a transposed view): cast to f32 when upcast, reshaped for bmm
    let g = up.then(|| c.make(t(v, f, "attention output grad (f32)")));
    if g.is_some() {
        c.drop_out_grad();
    }
    let g2 = c.make(t(v, w, "attention output grad (bmm layout)"));
    if let Some(g) = g {
        c.drop(g);
    }
    let vg = c.make(t(v, w, "attention v grad"));
    let pg = c.make(t(p, w, "attention probs grad"));
    if !up {
        c.drop_out_grad();
    }
    c.drop(g2);
    c.release(VC);
    let sg = c.make(t(p, w, "softmax grad"));
    c.drop(pg);
    c.release(PROBS);
    let kg = c.make(t(q, w, "attention k grad"));
    let qg = c.make(t(q, w, "attention q grad"));
    c.drop(sg);
    c.release(QS);
    c.release(KS);
    // MulBackward of kᵀ · sqrt(scale), then of q · sqrt(scale)
    let kg2 = c.make(t(q, w, "attention k grad (scaled)"));
    c.drop(kg);
    let (kg, vg) = if up {
        let qg2 = c.make(t(q, w, "attention q grad (scaled)"));
        c.drop(qg);
        // the f32 upcasts' ToCopyBackward: v, k, then q (q's is the piece of q_b_proj's grad)
        let v16 = c.make(t(v, cd, "attention v grad (cast)"));
        c.drop(vg);
        let k16 = c.make(t(q, cd, "attention k grad (cast)"));
        c.drop(kg2);
        c.input_grad(0);
        c.input_grad(1);
        c.drop(qg2);
        (k16, v16)
    } else {
        c.input_grad(0);
        c.input_grad(1);
        c.drop(qg);
        (kg2, vg)
    };
    mla_backward_tail(&mut c, cd, kg, vg, sizes);
    m.bwd_chain = c.steps;
}

/// The latent attention's forward q (cat) and k (new_empty + copies), alive together through
/// a kernel that does not save them.
fn mla_qk_scratch(m: &mut OpMem, q: u64, cd: DType) {
    m.fwd_scratch_together = true;
    m.fwd_scratch.push(t(q, cd, "q (cat)"));
    m.fwd_scratch.push(t(q, cd, "k (new_empty + copy_)"));
}

/// Element counts of one latent attention: q (and k), q's rotary part, k's non-rotary part,
/// kv_b_proj's output.
#[derive(Clone, Copy)]
struct MlaSizes {
    q: u64,
    r: u64,
    nope: u64,
    kv: u64,
}

/// The latent part of [`mla_attention`]'s backward, from k's grad (`kg`) and v's (`vg`).
fn mla_backward_tail(c: &mut Chain, cd: DType, kg: usize, vg: usize, z: MlaSizes) {
    // CopySlices of `key[..., nope:].copy_(k_rot)`: k's grad copied whole, the rotated slice
    // cloned (k_rot's grad) and zeroed in the copy (CopyBackwards' zeros)
    let whole = c.make(t(z.q, cd, "k grad (CopySlices copy)"));
    c.drop(kg);
    let kr = c.make(t(z.r, cd, "k_rot grad (slice clone)"));
    let zeros = c.make(t(z.r, cd, "k_rot grad zeros"));
    c.drop(zeros);
    // CopySlices of `key[..., :nope].copy_(k_nope)`: again, the slice cloned (new_empty
    // takes no grad: the whole copy is dropped)
    let whole2 = c.make(t(z.q, cd, "k grad (CopySlices copy)"));
    c.drop(whole);
    let kn = c.make(t(z.nope, cd, "k_nope grad (slice clone)"));
    c.drop(whole2);
    // ExpandBackward: the rotated key's grad summed over the heads
    c.input_grad(3);
    c.drop(kr);
    // SplitWithSizesBackward (k_nope, v): cat; then the heads' transpose and view: a copy
    let joined = c.make(t(z.kv, cd, "kv grad (split joined)"));
    c.drop(kn);
    c.drop(vg);
    c.input_grad(2);
    c.drop(joined);
}

/// SDPA runs its math kernel in f32 on half/bf16 inputs: on the CPU, with dropout (the CPU
/// flash kernel takes none). It then saves f32 copies of q, k and v, not its inputs.
pub fn sdpa_math_upcast(cx: &Ctx, dropout: f64) -> bool {
    cx.attn == AttnImpl::Sdpa && dropout > 0.0 && cx.device == Device::Cpu && cx.cd != DType::Float32
}

/// Gemma 2's eager soft-capping of the scaled scores (`s / c`, `tanh`, `· c`, then the mask):
/// tanh's result is saved; forward and backward make score-sized tensors down the chain, one
/// alive with the next.
fn softcap_scores(cx: &Ctx, m: &mut OpMem, heads: u64) {
    let (b, s, cd) = (cx.dims.batch, cx.dims.seq, cx.cd);
    let scores = b * heads * s * s;
    m.saved.push(t(scores, cd, "attention softcap tanh"));
    m.fwd_scratch.push(t(scores, cd, "attention softcap scores"));
    // (before the scores' grad, the last of the chain: the grads of `· c`, tanh and `/ c`)
    let last = m.bwd_scratch.pop();
    for what in ["softcap mul grad", "softcap tanh grad", "softcap div grad"] {
        m.bwd_scratch.push(t(scores, cd, what));
    }
    m.bwd_scratch.extend(last);
}

#[allow(clippy::too_many_arguments)]
fn attention(cx: &Ctx, op: &Op, m: &mut OpMem, heads: u64, kv: u64, hd: u64, dropout: f64, masked: bool) {
    let cd = cx.cd;
    let (b, s) = (cx.dims.batch, cx.dims.seq);
    let q = b * s * heads * hd;
    let scores = b * heads * s * s;
    let fused = op.inputs.len() == 1;
    let gqa = kv != heads;
    m.saves_inputs = vec![true; op.inputs.len()];
    // Fused qkv (GPT-2): q/k/v are split views of the c_attn output, saved through it.
    // The CPU flash kernel takes no dropout: SDPA falls back to the math path, which
    // (measured, GPT-2) saves what eager saves.
    let use_math = match cx.attn {
        AttnImpl::Eager => true,
        AttnImpl::Sdpa => dropout > 0.0 && cx.device == Device::Cpu,
        AttnImpl::FlashAttention2 => false,
    };
    if sdpa_math_upcast(cx, dropout) {
        // SDPA's math kernel on the CPU upcasts half/bf16 to float32 and works in it: it saves
        // the f32 copies of q (scaled), k and v instead of the inputs, and f32 probs, dropout
        // mask and dropped probs (measured: GPT-2 bf16, dropout 0.1, harness ORACLE_LIVE).
        let kvn = if fused { q } else { b * s * kv * hd };
        m.saves_inputs = vec![false; op.inputs.len()];
        m.saved.push(t(scores, DType::Float32, "attention probs dropped (f32)"));
        m.saved.push(t(kvn, DType::Float32, "attention v (f32)"));
        m.first_node_saved = m.saved.len();
        m.saved.push(t(q, DType::Float32, "attention q scaled (f32)"));
        m.saved.push(t(kvn, DType::Float32, "attention k (f32)"));
        m.saved.push(t(scores, DType::Float32, "attention probs (f32)"));
        m.saved.push(t(scores, DType::Float32, "dropout noise (f32)"));
        m.fwd_scratch.push(t(scores, DType::Float32, "attention scores (f32)"));
        m.fwd_scratch.push(t(q, DType::Float32, "attention output (f32)"));
        if fused {
            m.bwd_chain = math_upcast_backward(cd, q, scores);
        } else {
            // separate q/k/v (Llama family; not measured: none has attention dropout by
            // default): the grads down the chain, each alive with the next only
            for what in ["attention probs grad (f32)", "dropout grad (f32)", "softmax grad (f32)", "scores grad (f32)"] {
                m.bwd_scratch.push(t(scores, DType::Float32, what));
            }
        }
    } else if cx.attn == AttnImpl::Eager || use_math {
        // matmul(q, k^T) * scaling (+ mask) -> softmax (f32 in Llama-family, saved)
        // -> .to(dtype) -> dropout -> matmul(probs, v) -> transpose().contiguous().
        let probs_dtype = if fused { cd } else { DType::Float32 };
        let cast = probs_dtype != cd;
        // What matmul(probs, v) saves, the first node of the backward: released once it ran,
        // before softmax's backward (measured, Llama-3-70B eager: the peak is there).
        if dropout > 0.0 {
            m.saved.push(t(scores, cd, "attention probs dropped"));
        } else if cast {
            m.saved.push(t(scores, cd, "attention probs cast"));
        }
        if gqa && !fused {
            // repeat_kv's expand+reshape copies are what the matmuls save; the pre-repeat
            // k and v are not saved (measured: Llama/Qwen2/Mistral GQA, eager).
            m.saves_inputs = vec![true, false, false];
            m.saved.push(t(b * s * heads * hd, cd, "repeat_kv values"));
        }
        m.first_node_saved = m.saved.len();
        if gqa && !fused {
            m.saved.push(t(b * s * heads * hd, cd, "repeat_kv keys"));
        }
        m.saved.push(t(scores, probs_dtype, "attention probs"));
        if dropout > 0.0 {
            m.saved.push(cx.dropout_mask(scores));
        }
        m.fwd_scratch.push(t(scores, cd, "attention scores"));
        m.fwd_scratch.push(t(scores, cd, "attention scaled scores"));
        m.fwd_scratch.push(t(q, cd, "attention output (bhsd)"));
        // the grads down the chain, each alive with the next only: probs (matmul's), then
        // dropout's, the f32 upcast, softmax's, and the scores' (cast back, scaled)
        m.bwd_scratch.push(t(scores, cd, "attention probs grad"));
        if dropout > 0.0 {
            m.bwd_scratch.push(t(scores, cd, "dropout grad"));
        }
        if cast {
            m.bwd_scratch.push(t(scores, DType::Float32, "attention probs grad (f32)"));
        }
        m.bwd_scratch.push(t(scores, probs_dtype, "softmax grad"));
        m.bwd_scratch.push(t(scores, cd, "scores grad"));
    } else {
        // Flash-style kernels keep the output and a float32 log-sum-exp [b, h, s].
        m.saves_output = true;
        m.saved.push(t(b * heads * s, DType::Float32, "attention logsumexp"));
        if cx.device == Device::Cuda && cx.attn == AttnImpl::Sdpa {
            // CUDA's flash kernel also returns its philox seed and offset (uint64 [2] and [])
            // for the backward, dropout or not: one 512 B block each (measured: harness case
            // llama3_8b_gpu_bf16_ws8 on harness/fakegpu.py, 32 layers × 1,024 B)
            m.saved.push(t(2, DType::Int64, "attention philox seed"));
            m.saved.push(t(1, DType::Int64, "attention philox offset"));
        }
        // HF 5.17 passes enable_gqa to SDPA when there is no mask (causal, no padding):
        // no repeat_kv copies. With a (sliding-window) mask it repeats k and v, and SDPA
        // saves the copies and the layer's mask.
        let kernel_saved = m.saved.len();
        if gqa && masked && !fused {
            m.saves_inputs = vec![true, false, false];
            m.saved.push(t(q, cd, "repeat_kv keys"));
            m.saved.push(t(q, cd, "repeat_kv values"));
        }
        if masked {
            // sdpa_attention_forward materializes the layer's float mask (torch.where),
            // which SDPA saves.
            m.saved.push(t(b * s * s, cd, "sliding-window mask"));
        }
        m.input_copies = m.saved.len() - kernel_saved;
        m.bwd_scratch.push(t(q, cd, "attention grad scratch"));
    }
}

/// The backward of SDPA's math kernel on the CPU under half/bf16 (it works in f32), node by
/// node as autograd runs it: measured for GPT-2 (fused qkv, MHA), bf16, dropout 0.1, with a
/// dispatch mode logging every op and storage free of one attention's backward, and at real
/// size (GPT-2 XL, harness case `gpt2_xl_bf16_ac_ws4`: FSDP2's peak is the probs' grad `bmm`).
/// `saved` is laid out as the caller pushes it: dropped probs, v, q, k, probs, dropout noise.
/// k and v have q's size (fused qkv: as many kv heads as heads).
fn math_upcast_backward(cd: DType, q: u64, scores: u64) -> Vec<Step> {
    const DROPPED: usize = 0;
    const V: usize = 1;
    const Q: usize = 2;
    const K: usize = 3;
    const PROBS: usize = 4;
    const NOISE: usize = 5;
    let f = DType::Float32;
    let kvn = q;
    let mut c = Chain::default();
    // ToCopyBackward of the output's cast back to `cd`: the output's grad in f32
    let g = c.make(t(q, f, "attention output grad (f32)"));
    c.drop_out_grad();
    // matmul(probs, v): its grad reshaped for bmm (a copy: the grad is laid out [b, s, h, d])
    let g2 = c.make(t(q, f, "attention output grad (f32, bmm layout)"));
    c.drop(g);
    let vg = c.make(t(kvn, f, "attention v grad (f32)"));
    let pg = c.make(t(scores, f, "attention probs grad (f32)"));
    c.drop(g2);
    c.release(V);
    c.release(DROPPED);
    // dropout's backward (grad * noise), then softmax's
    let dg = c.make(t(scores, f, "dropout grad (f32)"));
    c.drop(pg);
    c.release(NOISE);
    let sg = c.make(t(scores, f, "softmax grad (f32)"));
    c.drop(dg);
    c.release(PROBS);
    // matmul(q, k^T): both grads, then each scaled (MulBackward of the sqrt(scale) factors)
    let kg = c.make(t(kvn, f, "attention k grad (f32)"));
    let qg = c.make(t(q, f, "attention q grad (f32)"));
    c.drop(sg);
    c.release(K);
    c.release(Q);
    let kg2 = c.make(t(kvn, f, "attention k grad scaled (f32)"));
    c.drop(kg);
    let qg2 = c.make(t(q, f, "attention q grad scaled (f32)"));
    c.drop(qg);
    // the f32 -> cd casts' backward (v, k, q), then the heads split's: two of the three
    // grads are made contiguous before `cat` joins them into the qkv projection's grad
    let v16 = c.make(t(kvn, cd, "attention v grad"));
    c.drop(vg);
    let k16 = c.make(t(kvn, cd, "attention k grad"));
    c.drop(kg2);
    let q16 = c.make(t(q, cd, "attention q grad"));
    c.drop(qg2);
    let c1 = c.make(t(kvn, cd, "attention grad (heads merged)"));
    c.drop(v16);
    let c2 = c.make(t(kvn, cd, "attention grad (heads merged)"));
    c.drop(k16);
    c.input_grad(0);
    c.drop(c1);
    c.drop(q16);
    c.drop(c2);
    c.steps
}

/// Lists what one op keeps for backward (its saved tensors and whether it keeps its
/// output), for golden tests and `--explain`.
pub fn explain(model: &Model, opts: &crate::options::Options, op_name: &str) -> String {
    let Some(i) = model.ops.iter().position(|o| o.name == op_name) else {
        return format!("  no op `{op_name}`\n");
    };
    let op = &model.ops[i];
    let attn = opts.attn_implementation.unwrap_or(AttnImpl::Sdpa);
    let cx = Ctx::new(model, opts, attn);
    let m = if opts.compile {
        // (what the partitioner keeps depends on the op's neighbours)
        let mut mems: Vec<OpMem> = model.ops.iter().map(|o| op_mem(&cx, o)).collect();
        let covered = compiled_ops(&cx, model);
        compiled(&cx, model, &mut mems, &covered);
        compiled_float8(&cx, model, &mut mems, &covered);
        mems.swap_remove(i)
    } else {
        op_mem(&cx, op)
    };
    let mut s = format!("  {} ({}, {}): saves\n", op.name, op.kind.name(), attn.name());
    if m.saves_output {
        if let Some(o) = m.out {
            s += &format!("    {:<28} {:>14} B\n", "output", o.bytes());
        }
    }
    let mut total = 0;
    for t in &m.saved {
        s += &format!("    {:<28} {:>14} B  ({} × {})\n", t.what, t.bytes(), t.numel, t.dtype);
        total += t.bytes();
    }
    s += &format!("    {:<28} {:>14} B per layer\n", "extra saved", total);
    s
}
