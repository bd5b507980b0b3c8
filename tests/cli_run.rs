//! `run`, `launch` and `consolidate` end to end (a `--features runtime` build; `scripts/test.sh`
//! runs it with the `cuda` build): bad run options, data and checkpoint directories are
//! refused by name with exit code 2 before anything trains, and no file of the user's is
//! replaced.
#![cfg(feature = "runtime")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(env!("CARGO_MANIFEST_DIR")).env("OMP_NUM_THREADS", "1").args(args).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
}

/// A scratch directory, removed when the guard drops (a failing test's too).
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fsdp-cli-run-{name}-")).tempdir().unwrap()
}

const M: &str = "models/tiny-llama.ron";
const R: [&str; 6] = ["--world-size", "2", "--batch", "2", "--seq", "8"];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["run", M];
    v.extend(R);
    v.extend(extra);
    v
}

fn tokens(path: &Path, ids: &[u32]) {
    std::fs::write(path, ids.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

#[test]
fn bad_run_options_and_data_are_refused_by_name() {
    let tmp = scratch("opts");
    let d = tmp.path();
    let (bad_vocab, short, odd) = (d.join("vocab.u32"), d.join("short.u32"), d.join("odd.u32"));
    let mut ids = vec![5u32; 64];
    ids[40] = 300;
    tokens(&bad_vocab, &ids);
    tokens(&short, &[5; 10]);
    std::fs::write(&odd, b"abc").unwrap();
    let txt = d.join("tokens.txt");
    std::fs::write(&txt, b"text, not ids").unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (with(&["--steps", "0"]), "--steps 0: expected at least 1 step".into()),
        (with(&["--lr", "nan"]), "--lr NaN: expected a finite learning rate >= 0".into()),
        (with(&["--lr=-5"]), "--lr -5: expected a finite learning rate >= 0".into()),
        (vec!["run", M, "--world-size", "1", "--batch", "2", "--seq", "1"], "--seq 1: a causal-LM loss needs at least 2 tokens".into()),
        (with(&["--timeout-s", "1e30"]), "expected a positive number of seconds (at most 1e9)".into()),
        (with(&["--data", bad_vocab.to_str().unwrap()]), format!("{}: token 300 at index 40 (byte 160) is not below the model's vocabulary size 256", bad_vocab.display())),
        (with(&["--data", short.to_str().unwrap()]), format!("{}: 10 tokens, but a step needs 32", short.display())),
        (with(&["--data", odd.to_str().unwrap()]), format!("{}: 3 bytes: not a whole number of uint32 token ids (4 bytes each)", odd.display())),
        (with(&["--data", txt.to_str().unwrap()]), "cannot tell the format of a `.txt` file: give --data-format".into()),
        (with(&["--data", bad_vocab.to_str().unwrap(), "--epochs", "0"]), "--epochs 0".into()),
        (with(&["--train-loop", "torchtitan-2024"]), "--train-loop torchtitan-2024: the runtime trains with HF's loss".into()),
        (with(&["--compile"]), "--compile: the runtime runs libtorch's eager kernels".into()),
        (with(&["--float8", "rowwise"]), "--float8 rowwise: the runtime runs torchao's tensorwise recipe only".into()),
        (with(&["--float8", "tensorwise", "--float8-all-gather", "--offload", "cpu"]), "--float8-all-gather with --offload cpu".into()),
        (vec!["launch", "--nproc-per-node", "3", "--master-port", "0", M, "--world-size", "2", "--batch", "2", "--seq", "8"], "launch: the plan is for world size 2, but --nproc-per-node 3 starts 3 ranks".into()),
        (vec!["launch", "--nproc-per-node", "2", "--master-port", "0", M, "--world-size", "2", "--bogus"], "launch: the ranks' arguments: error: unexpected argument '--bogus'".into()),
        (vec!["launch", "--nproc-per-node", "2", "--master-port", "0", M, "--world-size", "2", "--timeout-s", "1e30"], "--timeout-s 1000000000000000000000000000000: expected a positive number".into()),
    ];
    for (args, want) in &cases {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want.as_str()), "{args:?}: `{err}` lacks `{want}`");
        assert!(!out.contains("loss") && !err.contains("panicked") && !err.contains("[rank"), "{args:?} trained or started ranks: {out}{err}");
    }
}

/// `run --float8 tensorwise [--float8-all-gather]` trains torchao's float8 linears (their
/// numerics against torchao: runtime/tests/train_parity.rs): the loss moves away from the
/// plain run's from step 1 on.
#[test]
fn float8_linears_train() {
    let loss = |extra: &[&str]| {
        let (code, out, err) = run(&with(&[&["--steps", "2"], extra].concat()));
        assert_eq!(code, 0, "{extra:?}: {err}");
        // (the step lines are progress: on stderr)
        format!("{out}{err}").lines().filter(|l| l.starts_with("step")).map(|l| l.split_whitespace().nth(3).unwrap().parse::<f64>().unwrap()).collect::<Vec<f64>>()
    };
    let (plain, f8) = (loss(&[]), loss(&["--float8", "tensorwise"]));
    assert_eq!((plain.len(), f8.len()), (2, 2));
    assert!(f8.iter().zip(&plain).all(|(a, b)| a.is_finite() && (a - b).abs() > 1e-7 * b.abs() && (a - b).abs() < 1e-2 * b.abs()), "{plain:?} {f8:?}");
    // the weights gathered in float8: each shard cast with the whole weight's scale is the
    // bits the unsharded weight's cast gives, so float32 training is the same to the bit
    assert_eq!(loss(&["--float8", "tensorwise", "--float8-all-gather"]), f8);
    // under op-level SAC (torchtitan's policy keeps the casts' abs and amax for the
    // recompute, which takes them and the GEMM outputs it kept): the same numbers
    assert_eq!(loss(&["--float8", "tensorwise", "--checkpoint", "model.layers.{0..1}=selective-op"]), f8);
}

#[test]
fn a_compiled_plan_runs_alone_and_an_edited_one_is_refused() {
    let tmp = scratch("plan");
    let d = tmp.path();
    let plan = d.join("plan.ron");
    let mut c = vec!["compile", M];
    c.extend(R);
    c.extend(["-o", plan.to_str().unwrap()]);
    assert_eq!(run(&c).0, 0);
    // its model found in models/ by name
    let (code, _, err) = run(&["run", plan.to_str().unwrap(), "--steps", "1"]);
    assert!(code == 0 && err.contains("step    1"), "{err}");
    let text = std::fs::read_to_string(&plan).unwrap();
    std::fs::write(d.join("edited.ron"), text.replacen("shard_numel: 4096", "shard_numel: 4000", 1)).unwrap();
    let (code, _, err) = run(&["run", d.join("edited.ron").to_str().unwrap(), "--model", M, "--steps", "1"]);
    assert!(code == 2 && err.contains("shard_numel: 4000") && err.contains("the plan was edited"), "{err}");
}

#[test]
fn checkpoints_and_outputs_of_the_user_are_kept() {
    let tmp = scratch("ckpt");
    let d = tmp.path();
    let ck = d.join("ck");
    let cks = ck.to_str().unwrap();
    // a file named like the old temp name is the user's, and stays
    std::fs::write(d.join("m.tmp"), "MINE").unwrap();
    let trace = d.join("m.json");
    let (code, _, err) = run(&with(&["--steps", "1", "--save", cks, "--trace", trace.to_str().unwrap()]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(d.join("m.tmp")).unwrap(), "MINE");
    assert!(trace.exists());
    // a second run into the same directory would overwrite step 1: refused unless resuming it
    let (code, _, err) = run(&with(&["--steps", "1", "--save", cks]));
    assert!(code == 2 && err.contains("already holds a checkpoint (latest: step-00000001); continue it with --resume"), "{err}");
    let (code, _, err) = run(&with(&["--steps", "2", "--save", cks, "--resume", cks]));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&with(&["--steps", "2", "--resume", cks]));
    assert!(code == 2 && err.contains("the checkpoint is at step 2, and --steps 2 counts from the start: nothing left to run"), "{err}");
    // consolidate: never into the checkpoint itself
    let shard = ck.join("step-00000002/rank-0.safetensors");
    let before = std::fs::read(&shard).unwrap();
    let (code, _, err) = run(&["consolidate", cks, "-o", shard.to_str().unwrap()]);
    assert!(code == 2 && err.contains("that is the input"), "{err}");
    assert_eq!(std::fs::read(&shard).unwrap(), before);
    let out = d.join("full.safetensors");
    assert_eq!(run(&["consolidate", cks, "-o", out.to_str().unwrap()]).0, 0);
    // `latest` is followed only to a step directory
    std::fs::write(ck.join("latest"), "../../etc\n").unwrap();
    let (code, _, err) = run(&with(&["--steps", "3", "--resume", cks]));
    assert!(code == 2 && err.contains("latest: names `../../etc`, not a step directory"), "{err}");
    let (code, _, err) = run(&["consolidate", d.to_str().unwrap(), "-o", d.join("x.safetensors").to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    // under launch, a rank refusing a file only it reads (its own shard) ends the job with
    // exit 2 and its message, not as a dead peer
    std::fs::write(ck.join("latest"), "step-00000002\n").unwrap();
    std::fs::write(ck.join("step-00000002/rank-1.safetensors"), b"garbage!garbage!").unwrap();
    let mut l = vec!["launch", "--nproc-per-node", "2", "--master-port", "0"];
    l.extend(&with(&["--steps", "3", "--resume", cks, "--timeout-s", "60"])[1..]);
    let (code, _, err) = run(&l);
    assert!(code == 2 && err.contains("[rank 1] error: ") && err.contains("rank-1.safetensors: not a safetensors file") && err.contains("launch: rank 1 exited with code 2"), "{err}");
    let leftovers: Vec<String> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.contains(".tmp") && n != "m.tmp").collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// torchrun's multi-node flags: two `launch --nnodes 2 --node-rank k` on one machine make one
/// job of 4 ranks (node 1's are ranks 2 and 3); a node rank past the node count, a plan for
/// another world size and a free-port request across nodes are refused by name.
#[test]
fn launch_across_nodes_numbers_ranks_as_torchrun() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let node = move |k: &str| {
        Command::new(env!("CARGO_BIN_EXE_fsdp-plan"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["launch", "--nnodes", "2", "--node-rank", k, "--nproc-per-node", "2", "--master-port", &port, "rendezvous-selftest", "--collectives", "tcp"])
            .output()
            .unwrap()
    };
    let n1 = std::thread::spawn({
        let node = node.clone();
        move || node("1")
    });
    let n0 = node("0");
    let n1 = n1.join().unwrap();
    for (o, ranks) in [(&n0, [0, 1]), (&n1, [2, 3])] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
        for r in ranks {
            assert!(out.contains(&format!("[rank {r}] rank {r}/4: collectives ok")), "{out}");
        }
    }
    let (code, _, err) = run(&["launch", "--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "1", "rendezvous-selftest"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--node-rank 2 is not below --nnodes 2"), "{err}");
    let (code, _, err) = run(&["launch", "--nnodes", "2", "--nproc-per-node", "1", "--master-port", "0", "rendezvous-selftest"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("every node needs the same --master-port"), "{err}");
    let (code, _, err) = run(&["launch", "--nnodes", "2", "--nproc-per-node", "1", "models/tiny-llama.ron", "--world-size", "4", "--seq", "8"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--nnodes 2 × --nproc-per-node 1 starts 2 ranks: plan with --world-size 2"), "{err}");
}

/// The trainer as a user meets it: a nanoGPT uint16 `.bin` trains, a file shorter than the
/// run starts over once and says so (or `--epochs` ends the run), one JSON line per step
/// with the learning rate of the schedule and the gradient norm, a non-finite loss stops the
/// run with exit 3 (or is skipped), checkpoints are announced and thinned by `--keep-last`,
/// and resuming with other options is told.
#[test]
fn the_trainer_reads_nanogpt_bins_schedules_and_reports() {
    let tmp = scratch("trainer");
    let d = tmp.path();
    // 3 steps of 2 ranks × 2 × 8 tokens (tiny-llama's vocabulary is 256)
    let bin = d.join("train.bin");
    std::fs::write(&bin, (0..96u16).map(|i| (i * 7 + 3) % 256).flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let b = bin.to_str().unwrap();
    let (code, out, err) = run(&with(&["--data", b, "--steps", "7", "--lr-schedule", "cosine", "--warmup-steps", "2", "--min-lr", "1e-4", "--clip-grad-norm", "0.5", "--format", "json"]));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("step").is_some()).collect();
    assert_eq!(steps.len(), 7);
    let lr: Vec<f64> = steps.iter().map(|s| s["lr"].as_f64().unwrap()).collect();
    assert!((lr[0] - 1e-3 / 3.0).abs() < 1e-12 && (lr[6] - 1e-4).abs() < 1e-12, "{lr:?}");
    assert!(steps.iter().all(|s| s["grad_norm"].as_f64().is_some_and(|g| g > 0.0) && s["planned_peak_bytes"].as_u64().is_some() && s["mfu"].as_f64().is_some()));
    assert_eq!(steps[3]["epoch"], 1);
    assert!(lines.last().unwrap()["summary"]["final_loss"].as_f64().is_some());
    assert!(err.contains("read in full 1 time(s); step 4 starts over"), "{err}");
    // --epochs 1: three steps
    let (code, out, err) = run(&with(&["--data", b, "--steps", "7", "--epochs", "1", "--format", "json"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().filter(|l| l.contains("\"step\"")).count(), 3);
    assert!(err.contains("--epochs 1 of 3 steps each ends the run after step 3"), "{err}");
    // a non-finite loss: exit 3, or skipped
    let (code, _, err) = run(&with(&["--data", b, "--steps", "3", "--lr", "1e30"]));
    assert!(code == 3 && err.contains("step 2: the gradient norm is NaN"), "{code}: {err}");
    let (code, _, err) = run(&with(&["--data", b, "--steps", "3", "--lr", "1e30", "--skip-nonfinite"]));
    assert!(code == 0 && err.contains("update skipped"), "{code}: {err}");
    // checkpoints: announced, the last 2 kept; a resume with another --lr is told
    let ck = d.join("ck");
    let c = ck.to_str().unwrap();
    let (code, _, err) = run(&with(&["--data", b, "--steps", "3", "--save", c, "--save-every", "1", "--keep-last", "2"]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("checkpoint: saved step 3 to") && err.contains("(removed step-00000001)"), "{err}");
    let kept: Vec<_> = std::fs::read_dir(&ck).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("step-")).collect();
    assert_eq!(kept.len(), 2);
    let (code, _, err) = run(&with(&["--data", b, "--steps", "4", "--resume", c, "--lr", "5e-4"]));
    assert!(code == 0 && err.contains("resuming with options that differ from the checkpoint's: lr 0.001 → 0.0005"), "{err}");
    // options not given again on resume are the checkpoint's
    let ck2 = d.join("ck2");
    let c2 = ck2.to_str().unwrap();
    let (code, _, err) = run(&with(&["--data", b, "--steps", "2", "--save", c2, "--lr-schedule", "linear", "--warmup-steps", "1", "--clip-grad-norm", "0.5"]));
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&with(&["--data", b, "--steps", "3", "--resume", c2, "--format", "json"]));
    assert!(code == 0 && err.contains("resume: --lr-schedule, --warmup-steps, --clip-grad-norm as the checkpoint recorded them"), "{err}");
    let last: serde_json::Value = serde_json::from_str(out.lines().find(|l| l.contains("\"step\":3")).unwrap()).unwrap();
    // linear decay over steps 2..3 of 3: the last step at --min-lr 0
    assert!(last["lr"].as_f64().unwrap().abs() < 1e-12, "{last}");
    // bad schedule options are refused by name
    for (args, want) in [
        (vec!["--min-lr", "1"], "--min-lr 1: expected a rate between 0 and --lr"),
        (vec!["--warmup-steps", "10", "--steps", "3"], "--warmup-steps 10: the run has only 3 steps"),
        (vec!["--clip-grad-norm", "0"], "--clip-grad-norm 0"),
        (vec!["--beta2", "1"], "--beta2 1: torch.optim requires"),
    ] {
        let (code, _, err) = run(&with(&args));
        assert!(code == 2 && err.contains(want), "{args:?}: {err}");
    }
}

/// `--offload cpu` (FSDP2's CPUOffloadPolicy) runs: the shards, grads and AdamW state on the
/// host, each all-gather's shards copied in first. The device and the host are measured apart
/// (the CPU runtime counts each in its own tracker) and each is within 2% of the plan's; the
/// run trains bit for bit as the one without offload (the same kernels on the same values:
/// only where the tensors are counted differs), eval included.
#[test]
fn offload_keeps_the_state_on_the_host_and_trains_alike() {
    let tmp = scratch("offload");
    let d = tmp.path();
    let data = d.join("train.u32");
    tokens(&data, &(0..96u32).map(|i| (i * 7 + 3) % 256).collect::<Vec<_>>());
    let t = data.to_str().unwrap();
    let go = |extra: &[&str]| {
        let (code, out, err) = run(&with(&[&["--data", t, "--eval-data", t, "--eval-every", "2", "--steps", "4", "--grad-accum", "2", "--clip-grad-norm", "0.5", "--format", "json"][..], extra].concat()));
        assert_eq!(code, 0, "{extra:?}: {err}");
        out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).collect::<Vec<_>>()
    };
    let (on, off) = (go(&["--offload", "cpu"]), go(&[]));
    let series = |v: &[serde_json::Value], k: &str| v.iter().filter(|l| l.get("step").is_some()).map(|l| l[k].clone()).collect::<Vec<_>>();
    for k in ["loss", "grad_norm", "eval_loss"] {
        assert_eq!(series(&on, k), series(&off, k), "{k}");
    }
    let evals = series(&on, "eval_loss");
    assert!(series(&on, "grad_norm").iter().all(|g| g.is_f64()) && evals[1].is_f64() && evals[3].is_f64(), "{on:?}");
    let sum = &on.last().unwrap()["summary"];
    let near = |m: &str, p: &str| {
        let (m, p) = (sum[m].as_f64().unwrap(), sum[p].as_f64().unwrap());
        assert!((m / p - 1.0).abs() < 0.02, "{sum}");
        m
    };
    let (device, host) = (near("measured_peak_bytes", "predicted_peak_bytes"), near("measured_host_peak_bytes", "predicted_host_peak_bytes"));
    // the state left the device: less there than without offload, by about the host's state
    let without = off.last().unwrap()["summary"]["measured_peak_bytes"].as_f64().unwrap();
    assert!(without - device > 0.5 * host, "device {device} B, without offload {without} B, host {host} B");
    assert!(off.last().unwrap()["summary"]["measured_host_peak_bytes"].is_null());
    // a checkpoint of the host's shards and AdamW state resumes the run exactly
    let ck = d.join("ck");
    let c = ck.to_str().unwrap();
    let part = |steps: &str, extra: &[&str]| {
        let (code, out, err) = run(&with(&[&["--data", t, "--steps", steps, "--grad-accum", "2", "--offload", "cpu", "--format", "json"][..], extra].concat()));
        assert_eq!(code, 0, "{err}");
        out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).filter(|l| l.get("step").is_some()).map(|l| l["loss"].clone()).collect::<Vec<_>>()
    };
    let whole = part("4", &[]);
    assert_eq!(part("2", &["--save", c]), whole[..2]);
    assert_eq!(part("4", &["--resume", c]), whole[2..]);
}

/// `--eval-data`: the held-out loss of the model as it stands. With one window of data the
/// run trains on the same batch every step, so the eval after step k (gathered parameters,
/// no gradients) is the training loss of step k + 1 (the sharded executor's forward).
#[test]
fn eval_loss_is_the_loss_of_the_model_as_it_stands() {
    let tmp = scratch("eval");
    let d = tmp.path();
    let one = d.join("one.u32");
    std::fs::write(&one, (0..32u32).map(|i| (i * 11 + 5) % 256).flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let o = one.to_str().unwrap();
    // (and with float8 weights gathered in float8 under bf16 params: eval casts them from the
    // float32 masters, as the all-gather does, not from their bf16 copies)
    for extra in [&[][..], &["--float8", "tensorwise", "--float8-all-gather", "--param-dtype", "bf16", "--reduce-dtype", "f32"][..]] {
        let (code, out, err) = run(&with(&[&["--data", o, "--eval-data", o, "--eval-every", "1", "--steps", "4", "--lr", "1e-2", "--format", "json"][..], extra].concat()));
        assert_eq!(code, 0, "{err}");
        let steps: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).filter(|l| l.get("step").is_some()).collect();
        for k in 0..3 {
            let (e, next) = (steps[k]["eval_loss"].as_f64().unwrap(), steps[k + 1]["loss"].as_f64().unwrap());
            assert!((e - next).abs() / next < 1e-5, "{extra:?}: eval after step {} = {e}, training loss of step {} = {next}", k + 1, k + 2);
        }
    }
    let (code, _, err) = run(&with(&["--data", o, "--eval-data", o, "--eval-batches", "3"]));
    assert!(code == 2 && err.contains("1 global batch(es) of 32 tokens, --eval-batches asks for 3"), "{err}");
}

/// Text in: `--data corpus.txt --tokenizer tokenizer.json` tokenizes once into a cached token
/// file beside the text, with the ids HF tokenizers (Python) gives; a second run reuses it; a
/// tokenizer larger than the model's vocabulary is refused.
#[test]
fn text_is_tokenized_as_hf_tokenizers_does_and_cached() {
    let tmp = scratch("tok");
    let d = tmp.path();
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let text = d.join("sample.txt");
    std::fs::copy(fx.join("sample.txt"), &text).unwrap();
    let tok = fx.join("bpe-200.json");
    let args = |extra: &[&'static str]| {
        let mut a: Vec<String> = ["run", M, "--world-size", "2", "--batch", "2", "--seq", "8", "--steps", "2", "--data"].iter().map(|s| s.to_string()).collect();
        a.push(text.to_str().unwrap().into());
        a.push("--tokenizer".into());
        a.push(tok.to_str().unwrap().into());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let a = args(&[]);
    let (code, _, err) = run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(code == 0 && err.contains("data: tokenized") && err.contains("(2190 tokens)"), "{err}");
    let cache: Vec<PathBuf> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "bin")).collect();
    assert_eq!(cache.len(), 1);
    let ids: Vec<u64> = std::fs::read(&cache[0]).unwrap().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u64).collect();
    let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fx.join("sample.ids.json")).unwrap()).unwrap();
    let want: Vec<u64> = want["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(ids, want);
    // reused
    let (code, _, err) = run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(code == 0 && !err.contains("data: tokenized"), "{err}");
    // tiny-gpt2's vocabulary (211) is smaller than the byte-level tokenizer's 256
    let (code, _, err) = run(&["run", "models/tiny-gpt2.ron", "--world-size", "1", "--seq", "8", "--data", text.to_str().unwrap(), "--tokenizer", "models/tokenizers/bytes-256.json"]);
    assert!(code == 2 && err.contains("256 tokens, more than the model's vocabulary of 211"), "{err}");
}
