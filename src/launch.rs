//! `fsdp-plan launch` (N local ranks, as torchrun) and `rendezvous-selftest`.

use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
#[cfg(feature = "runtime")]
use {
    crate::cli::{parse_cli, refuse_plan_options, Cmd},
    crate::run::{run_inputs, timeout_secs},
    anyhow::{anyhow, Context},
};

#[derive(Args)]
pub(crate) struct LaunchArgs {
    /// Ranks to start on this machine.
    #[arg(long)]
    pub(crate) nproc_per_node: usize,
    /// Nodes in the job, each running this `launch` with the same arguments but its
    /// --node-rank (torchrun's static rendezvous).
    #[arg(long, default_value_t = 1)]
    pub(crate) nnodes: usize,
    /// This node's index (0 … nnodes − 1); its ranks are node_rank × nproc-per-node + local rank.
    #[arg(long, default_value_t = 0)]
    pub(crate) node_rank: usize,
    /// Where rank 0 listens (node 0's address; this machine for one node).
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) master_addr: String,
    /// Rank 0's rendezvous port (0: pick a free one, one node only).
    #[arg(long, default_value_t = 29500)]
    pub(crate) master_port: u16,
    /// What each rank runs: `MODEL|PLAN [run options]` (= `run MODEL|PLAN …`), or
    /// `rendezvous-selftest [options]`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "PLAN_OR_MODEL [RUN ARGS]")]
    pub(crate) args: Vec<std::ffi::OsString>,
}

#[derive(Args)]
pub(crate) struct SelftestArgs {
    /// Seconds rank 0 waits for every rank (and the others for rank 0).
    #[arg(long, default_value_t = 30.0)]
    pub(crate) timeout_s: f64,
    /// Also check all-gather / reduce-scatter / all-reduce over this backend (`tcp`: CPU
    /// tensors through rank 0's sockets; `nccl`: one GPU per rank, LOCAL_RANK's; needs the
    /// `cuda` feature).
    #[arg(long, default_value = "none", value_parser = ["none", "tcp", "nccl"])]
    pub(crate) collectives: String,
    /// This rank exits with code 3 after the rendezvous (tests `launch`'s failure handling).
    #[arg(long)]
    pub(crate) fail_rank: Option<usize>,
}

/// The most processes `launch` starts on one node.
#[cfg(feature = "runtime")]
pub(crate) const MAX_LOCAL_RANKS: usize = 1024;

/// `fsdp-plan launch`: the child runs `fsdp-plan run ARGS…` (or the subcommand given first).
#[cfg(feature = "runtime")]
pub(crate) fn launch(a: LaunchArgs) -> Result<()> {
    let mut args = a.args;
    if !args.first().is_some_and(|f| f == "run" || f == "rendezvous-selftest") {
        args.insert(0, "run".into());
    }
    if a.nproc_per_node > MAX_LOCAL_RANKS {
        bail!(UserError(format!("launch: --nproc-per-node {}: at most {MAX_LOCAL_RANKS} ranks on one node", a.nproc_per_node)));
    }
    // every rank would fail on bad arguments: say so once, before starting any
    if args[0] == "run" {
        let argv = std::iter::once(std::ffi::OsString::from("fsdp-plan")).chain(args.iter().cloned());
        let r = match parse_cli(argv) {
            Ok((cli, m)) => {
                refuse_plan_options(&cli, &m)?;
                match cli.cmd {
                    Cmd::Run(r) => r,
                    _ => unreachable!("the first argument is `run`"),
                }
            }
            Err(e) => bail!(UserError(format!("launch: the ranks' arguments: {}", e.render().to_string().trim_end()))),
        };
        let (plan, _) = run_inputs(&r)?;
        let world = a.nproc_per_node * a.nnodes.max(1);
        if plan.options.world_size != world as u64 {
            let how = if a.nnodes > 1 { format!("--nnodes {} × --nproc-per-node {}", a.nnodes, a.nproc_per_node) } else { format!("--nproc-per-node {}", a.nproc_per_node) };
            bail!(UserError(format!("launch: the plan is for world size {}, but {how} starts {world} ranks: plan with --world-size {world}", plan.options.world_size)));
        }
    }
    let spec = fsdp_runtime::launch::LaunchSpec {
        nproc: a.nproc_per_node,
        nnodes: a.nnodes.max(1),
        node_rank: a.node_rank,
        master_addr: a.master_addr.clone(),
        master_port: a.master_port,
        program: std::env::current_exe().context("finding this executable")?,
        args,
        // as torchrun: one intra-op thread per rank unless the user says otherwise
        env: if a.nproc_per_node > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() { vec![("OMP_NUM_THREADS".into(), "1".into())] } else { vec![] },
    };
    fsdp_runtime::launch::launch(&spec).map_err(|e| match e {
        // a rank that refused its input (exit 2, its message above) is bad input of the job
        fsdp_runtime::launch::LaunchError::NoProcs
        | fsdp_runtime::launch::LaunchError::NodeRank { .. }
        | fsdp_runtime::launch::LaunchError::PortOnMany(_)
        | fsdp_runtime::launch::LaunchError::RankFailed { code: Some(2), .. } => user(e),
        e => anyhow!(e),
    })
}

#[cfg(feature = "runtime")]
pub(crate) fn rendezvous_selftest(a: SelftestArgs) -> Result<()> {
    use fsdp_runtime::{launch_env, nccl, rendezvous, selftest};
    let env = launch_env::from_process_env_or_single().map_err(user)?;
    let cfg = rendezvous::Config::from_env(&env, timeout_secs(a.timeout_s)?);
    match a.collectives.as_str() {
        "nccl" => {
            let rz = nccl::rendezvous(&cfg).map_err(|e| anyhow!(e))?;
            let ordinal = fsdp_runtime::train::gpu_ordinal(env.local_rank, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
            let group = nccl::NcclGroup::from_rendezvous(&rz, ordinal).map_err(|e| anyhow!("rank {}: {e}", env.rank))?;
            outln!("rank {}/{}: NCCL communicator on cuda:{ordinal}", rz.rank, rz.world_size);
            outln!("{}", selftest::check_collectives(&group, group.device()).map_err(|e| anyhow!("rank {}: {e}", env.rank))?);
            rz.barrier(Some(cfg.timeout)).map_err(|e| anyhow!(e))?;
        }
        "tcp" => {
            let rz = rendezvous::rendezvous(&cfg, || Ok(rendezvous::random_id())).map_err(|e| anyhow!(e))?;
            let group = fsdp_runtime::comm_tcp::TcpGroup::new(rz, Some(cfg.timeout));
            outln!("{}", selftest::check_collectives(&group, selftest::cpu()).map_err(|e| anyhow!("rank {}: {e}", env.rank))?);
            group.rendezvous().barrier(Some(cfg.timeout)).map_err(|e| anyhow!(e))?;
        }
        _ => outln!("{}", rendezvous::selftest(&cfg).map_err(|e| anyhow!(e))?),
    }
    if a.fail_rank == Some(env.rank) {
        eprintln!("rank {}: failing on purpose (--fail-rank)", env.rank);
        std::process::exit(3);
    }
    Ok(())
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn launch(_: LaunchArgs) -> Result<()> {
    bail!(UserError(NO_RUNTIME.into()))
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn rendezvous_selftest(_: SelftestArgs) -> Result<()> {
    bail!(UserError(NO_RUNTIME.into()))
}

#[cfg(not(feature = "runtime"))]
pub(crate) const NO_RUNTIME: &str = "this fsdp-plan was built without the runtime: build with `cargo build --features runtime` after `bash scripts/setup-venv.sh && source scripts/env.sh` (libtorch from the project venv)";
