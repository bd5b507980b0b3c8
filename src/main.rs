//! The `fsdp-plan` command line: parses the arguments and dispatches to the command's module
//! (one per command); a user error exits with code 2, a training run stopped by a
//! non-finite loss with 3, any other failure with 1.

mod allocator;
mod calibrate;
mod cli;
mod compile;
mod diff;
mod import;
mod io;
mod launch;
mod models;
mod plan;
mod rows;
mod run;
mod sweep;
#[cfg(feature = "runtime")]
mod tokenize;
mod trace;
mod tune;

use cli::Cmd;
use std::process::ExitCode;

fn dispatch(cli: cli::Cli, m: &clap::ArgMatches) -> anyhow::Result<()> {
    cli::refuse_plan_options(&cli, m)?;
    match cli.cmd {
        Cmd::Plan { p, hw } => plan::run(p, hw),
        Cmd::Compile { p, output } => compile::run(p, output),
        Cmd::Diff(d) => diff::run(d),
        Cmd::Trace(v) => trace::trace(v),
        Cmd::Plot(v) => trace::plot(v),
        Cmd::Sweep(s) => sweep::sweep(&s),
        Cmd::Rows(r) => rows::run(r),
        Cmd::Models(a) => models::run(a),
        Cmd::Tune(t) => tune::run(t),
        Cmd::Fit(f) => tune::fit(f),
        Cmd::Run(r) => run::train(*r, m.subcommand_matches("run")),
        Cmd::Launch(a) => launch::launch(a),
        Cmd::RendezvousSelftest(a) => launch::rendezvous_selftest(a),
        Cmd::Calibrate { p, trace, hardware, output } => calibrate::run(p, trace, hardware, output),
        Cmd::Consolidate { dir, output, hf, config } => run::consolidate(&dir, output.as_deref(), hf.as_deref(), config.as_deref()),
        Cmd::Import { from } => import::run(from),
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    // `fsdp-plan MODEL [opts]` = `fsdp-plan plan MODEL [opts]`
    if args.len() > 1 && !cli::SUBCOMMANDS.contains(&args[1].as_str()) {
        args.insert(1, "plan".into());
    }
    let (cli, matches) = match cli::parse_cli(&args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match dispatch(cli, &matches) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<io::UserError>().is_some() {
                ExitCode::from(2)
            } else if e.downcast_ref::<io::NonFinite>().is_some() {
                ExitCode::from(3)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
