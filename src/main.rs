#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;
use std::io::Read;
use switchyard::cli::{
    CertsArgs, Cli, Command, ExplainArgs, LogFormat, NumaUnknownArg, RegisterWorkerArgs, ServeArgs,
    SimulateArgs, TopologyCommand,
};
use switchyard::config::{FileConfig, ServeSettings};

// mimalloc: the dispatcher and `simulate` allocate and free many small maps and strings per
// pass; glibc's allocator fragments under that (a third of `simulate`'s time went to it on
// 100,000 Jobs), mimalloc does not. `cap` counts what is allocated (an atomic add per call, no
// limit set) for `/metrics`: resident memory alone cannot tell a leak from what mimalloc keeps
// for reuse.
#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

/// Errors end the process with 1 and one line on stderr: what failed, then each cause that
/// line does not already say. No backtrace, even with `RUST_BACKTRACE` set (as many
/// developers' shells have it): these are a user's mistakes or a cluster's state, not bugs.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            note(&format!("Error: {}", error_line(&e)));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes `text` to stdout. A reader that stops reading (`| head`) is not an error: what it
/// did not read is not shown, as with any Unix tool, and the command goes on (a `--report`
/// file is still written).
fn emit(text: &str) -> anyhow::Result<()> {
    emit_parts(&[text])
}

/// [`emit`] of `parts` one after the other, without joining them first (a report of 100,000
/// Jobs is tens of MB).
fn emit_parts(parts: &[&str]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = (parts.iter()).try_for_each(|p| out.write_all(p.as_bytes()));
    match written.and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.context("cannot write to stdout"),
    }
}

/// A line on stderr; one that cannot be written is dropped: there is nowhere left to say so.
fn note(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The error and its causes on one line, `: ` between them; a cause the line already ends
/// with (an error that quotes its source last, as `cannot read X: {source}`) is not said twice.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = unpictured(&cause.to_string());
        if line.is_empty() {
            line = text;
        } else if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// A message over several lines as one: a parser's picture of its input (a YAML error's
/// ` --> <input>:2:13`, the input's line under a `2 |` gutter, a caret under the column with
/// the message's last words again) is left out, since the message already names the line and
/// column; what follows the repeated words is kept, and the rest is joined with spaces.
fn unpictured(text: &str) -> String {
    let mut out = String::new();
    for raw in text.lines() {
        let trimmed = raw.trim();
        if trimmed.starts_with("-->") {
            continue;
        }
        let after_number = trimmed.trim_start_matches(|c: char| c.is_ascii_digit());
        let part = match after_number.trim_start().strip_prefix('|') {
            // The input's own line (`2 | clusters: [[[`).
            Some(_) if after_number.len() != trimmed.len() => continue,
            Some(under) => {
                let label = under.trim_start().trim_start_matches(['^', '~']);
                after_repeated(&out, label.trim_start())
            }
            None => trimmed,
        };
        if part.is_empty() {
            continue;
        }
        // Text that closes a bracket or a clause joins what it closes.
        if !out.is_empty() && !part.starts_with([')', ']', ',', ';', '.']) {
            out.push(' ');
        }
        out.push_str(part);
    }
    out
}

/// `label` without the longest start of it, ending at a word's end, that `said` ends with.
fn after_repeated<'a>(said: &str, label: &'a str) -> &'a str {
    let word_end = |k: usize| {
        label.is_char_boundary(k) && !label[k..].starts_with(|c: char| c.is_alphanumeric()) && k > 1
    };
    (1..=label.len())
        .rev()
        .find(|&k| word_end(k) && said.ends_with(&label[..k]))
        .map_or(label, |k| label[k..].trim_start())
}

fn run() -> anyhow::Result<()> {
    switchyard::metrics::report_heap_with(|| ALLOCATOR.allocated());
    let cli = Cli::parse();
    switchyard::install_crypto_provider();
    match cli.command {
        Command::Serve(args) => serve(cli.log_format, cli.log_filter, &args),
        Command::Certs(args) => certs(args),
        Command::Topology(TopologyCommand::Merge) => topology_merge(),
        Command::Explain(args) => explain(&args),
        Command::Crds => emit(&switchyard::api::crds_yaml()),
        Command::Simulate(args) => simulate(&args),
        Command::RegisterWorker(args) => register_worker(args),
    }
}

/// `register-worker`: the manifests on stdout, warnings on stderr.
fn register_worker(args: RegisterWorkerArgs) -> anyhow::Result<()> {
    let source = switchyard::register::Source {
        worker: switchyard::register::Worker {
            name: args.name,
            scheduler_name: args.scheduler_name,
            labels: args.labels.into_iter().collect(),
            kueue_local_queue: args.kueue_local_queue,
        },
        kubeconfig: args.kubeconfig,
        context: args.context,
        server: args.server,
        manager_namespace: args
            .manager_namespace
            .unwrap_or_else(|| args.namespace.clone()),
        namespace: args.namespace,
        token_secret: args.token_secret,
        wait: std::time::Duration::from_secs(args.wait),
        request_timeout: std::time::Duration::from_secs(args.request_timeout),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let manifests = runtime.block_on(switchyard::register::manifests(&source, &mut |w| {
        note(&format!("Warning: {w}"))
    }));
    // A credential plugin given up on may still run: not waited for.
    runtime.shutdown_background();
    emit(&manifests?)
}

/// `serve`: the configuration (flags over file), logging, then the server until SIGTERM.
fn serve(
    log_format: Option<LogFormat>,
    log_filter: Option<String>,
    args: &ServeArgs,
) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let format = log_format.or(file.log_format).unwrap_or(LogFormat::Text);
    let filter = log_filter.or(file.log.clone());
    switchyard::telemetry::init(format, filter.as_deref()).map_err(anyhow::Error::msg)?;
    let settings = ServeSettings::resolve(args, file)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(switchyard::server::run(settings))?;
    Ok(())
}

/// `certs`: a development CA and serving pair, for the names asked (else this machine's).
fn certs(args: CertsArgs) -> anyhow::Result<()> {
    let (default_dns, default_ips) = switchyard::certs::default_names();
    let dns = if args.dns.is_empty() {
        default_dns
    } else {
        args.dns
    };
    let ips = if args.ip.is_empty() {
        default_ips
    } else {
        args.ip
    };
    let generated = switchyard::certs::generate(&dns, &ips)?;
    switchyard::certs::write(&args.out, &generated)?;
    let names: Vec<String> = dns
        .iter()
        .cloned()
        .chain(ips.iter().map(ToString::to_string))
        .collect();
    emit(&format!(
        "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key for {1}\n",
        args.out.display(),
        names.join(", ")
    ))
}

/// `topology merge`: merge cases (JSON on stdin) to their results, as the vectors hold them.
fn topology_merge() -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("cannot read merge cases from stdin")?;
    let output = switchyard::topology::conformance::run_cases(&input)
        .context("stdin is not a JSON array of Topology Manager merge cases")?;
    emit_parts(&[&output, "\n"])
}

/// `explain`: why a pod fits or not, per node or cluster of an inventory file.
fn explain(args: &ExplainArgs) -> anyhow::Result<()> {
    let loaded = switchyard::inventory::load_file(&args.inventory)?;
    for warning in &loaded.warnings {
        note(&format!("warning: inventory: {warning}"));
    }
    let inventory = loaded.inventory;
    let text = std::fs::read_to_string(&args.pod)
        .with_context(|| format!("cannot read pod {}", args.pod.display()))?;
    let pod = switchyard::explain::read_pod_file(&text)
        .map_err(|e| anyhow::anyhow!("{} {e}", args.pod.display()))?;
    for warning in &pod.warnings {
        note(&format!("warning: pod: {warning}"));
    }
    let config = switchyard::placement::EngineConfig {
        numa_unknown: match args.numa_unknown {
            NumaUnknownArg::Allow => switchyard::placement::NumaUnknown::Allow,
            NumaUnknownArg::Deny => switchyard::placement::NumaUnknown::Deny,
        },
        ..Default::default()
    };
    let target = match (&args.node, &args.cluster) {
        (Some(n), _) => switchyard::explain::Target::Node(n),
        (_, Some(c)) => switchyard::explain::Target::Cluster(c),
        _ => switchyard::explain::Target::Everything,
    };
    let report = switchyard::explain::render(&inventory, &pod.shapes, target, &config)
        .map_err(anyhow::Error::msg)?;
    emit(&report)
}

/// `simulate`: the scenario (or the bundled one) under each strategy asked, then the reports.
fn simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    use switchyard::cli::{SimOutput, SimStrategy};
    use switchyard::simulate::{self, Strategy};
    let read = match &args.scenario {
        Some(path) => simulate::scenario::read_file(path)?,
        None => simulate::scenario::read(simulate::scenario::BUNDLED)
            .context("the bundled scenario does not parse")?,
    };
    // Said before the checks, which a skipped key may be the cause of failing.
    for warning in &read.warnings {
        note(&format!("warning: scenario: {warning}"));
    }
    let scenario = read.check()?;
    // Opened before the run: a path that cannot be written fails at once, not after it.
    let report_file = args
        .report
        .as_ref()
        .map(|path| {
            std::fs::File::create(path)
                .with_context(|| format!("cannot write the report to {}", path.display()))
        })
        .transpose()?;
    let strategies = match args.strategy {
        SimStrategy::Switchyard => vec![Strategy::Switchyard],
        SimStrategy::AllAtOnce => vec![Strategy::AllAtOnce],
        SimStrategy::SumAggregate => vec![Strategy::SumAggregate],
        SimStrategy::All => Strategy::ALL.to_vec(),
    };
    let mut reports = Vec::new();
    for strategy in strategies {
        let mut sim = simulate::Simulation::new(&scenario, strategy);
        if args.events {
            sim = sim.with_events();
        }
        if args.report.is_some() {
            sim = sim.with_usage_history();
        }
        let report = sim.run();
        if args.events && args.strategy == SimStrategy::All {
            note(&format!("strategy: {}", strategy.as_str()));
        }
        for line in &report.events {
            note(line);
        }
        reports.push(report);
    }
    match (args.output, reports.as_slice()) {
        (SimOutput::Json, [one]) => emit_parts(&[&one.to_json(), "\n"])?,
        (SimOutput::Text, [one]) => emit(&one.to_text())?,
        (SimOutput::Json, many) => emit_parts(&[&simulate::report::compare_json(many), "\n"])?,
        (SimOutput::Text, many) => emit(&simulate::report::compare_text(many))?,
    }
    if let (Some(mut file), Some(path)) = (report_file, &args.report) {
        use std::io::Write as _;
        let source = args.scenario.as_ref().map_or_else(
            || "examples/scenario.yaml (bundled)".to_string(),
            |p| p.display().to_string(),
        );
        let page = simulate::report::html::render(&scenario, &reports, &source);
        file.write_all(page.as_bytes())
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::error_line;
    use anyhow::Context as _;

    #[test]
    fn an_error_line_gives_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let quoted: anyhow::Result<()> =
            Err(io).context("cannot read scenario s.yaml: no such file");
        assert_eq!(
            error_line(&quoted.unwrap_err()),
            "cannot read scenario s.yaml: no such file"
        );
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let chained: anyhow::Result<()> = Err(io).context("cannot write the report to r.html");
        assert_eq!(
            error_line(&chained.unwrap_err()),
            "cannot write the report to r.html: denied"
        );
        // A cause is left out only when the line ends with it, not wherever its words occur.
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let inside: anyhow::Result<()> = Err(io).context("cannot write the report to denied.html");
        assert_eq!(
            error_line(&inside.unwrap_err()),
            "cannot write the report to denied.html: denied"
        );
        // A parser's picture of the input stays out of the line, and what the message says
        // after it stays in (kube's error for an unreadable KUBECONFIG, as `serve` wraps it).
        let picture =
            "\n --> <input>:2:13\n  |\n2 | clusters: [[[\n  |             ^ unclosed bracket '['";
        let pictured = anyhow::anyhow!(
            "cannot build a Kubernetes client: kubeconfig: (failed to parse kubeconfig YAML: error: line 2 column 13: unclosed bracket '['{picture}); set KUBECONFIG or run in a pod, or pass --standalone to run without a cluster"
        );
        assert_eq!(
            error_line(&pictured),
            "cannot build a Kubernetes client: kubeconfig: (failed to parse kubeconfig YAML: error: line 2 column 13: unclosed bracket '['); set KUBECONFIG or run in a pod, or pass --standalone to run without a cluster"
        );
        let caret_last: anyhow::Result<()> = Err(anyhow::anyhow!(
            "failed to parse kubeconfig YAML: error: line 2 column 13: unclosed bracket '['{picture}"
        ))
        .context("cannot read the worker's kubeconfig k");
        assert_eq!(
            error_line(&caret_last.unwrap_err()),
            "cannot read the worker's kubeconfig k: failed to parse kubeconfig YAML: error: line 2 column 13: unclosed bracket '['"
        );
        // Other messages over several lines are joined, nothing dropped.
        let lines = anyhow::anyhow!("first part\n  second | part\nthird");
        assert_eq!(error_line(&lines), "first part second | part third");
    }
}
