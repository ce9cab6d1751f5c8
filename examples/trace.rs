//! Writes the mixed, GPU-oversubscribed trace (`simulate::synthetic::mixed_trace`) as a
//! scenario file on stdout:
//!
//!     cargo run --release --example trace -- CLUSTERS NODES JOBS SEED [--scheduler NAME] > trace.yaml
//!     cargo run --release -- simulate --scenario trace.yaml --strategy all
//!
//! `--scheduler NAME` gives every cluster that `schedulerName`: their pods are placed
//! NUMA-aware.

use std::process::ExitCode;

const USAGE: &str = "usage: trace CLUSTERS NODES JOBS SEED [--scheduler NAME]
  e.g. trace 10 50 5000 7: 10 clusters of 50 nodes, 5000 Jobs, seed 7";

fn main() -> ExitCode {
    match parse(std::env::args().skip(1).collect()) {
        Ok((counts, seed, scheduler)) => {
            let [clusters, nodes, jobs] = counts;
            print!(
                "{}",
                switchyard::simulate::synthetic::mixed_trace(
                    clusters,
                    nodes,
                    jobs,
                    seed,
                    scheduler.as_deref()
                )
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("{why}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The three counts, the seed and the scheduler name, or what is wrong with the arguments.
fn parse(args: Vec<String>) -> Result<([usize; 3], u64, Option<String>), String> {
    let mut numbers = Vec::new();
    let mut scheduler = None;
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--scheduler" => {
                scheduler = Some(args.next().ok_or("--scheduler needs a scheduler name")?);
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => numbers.push(a),
        }
    }
    let [clusters, nodes, jobs, seed] = numbers.as_slice() else {
        return Err(format!("expected 4 numbers, got {}", numbers.len()));
    };
    let count = |name: &str, text: &str| -> Result<usize, String> {
        match text.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{name}: {text:?} is not a whole number above 0")),
        }
    };
    let seed = seed
        .parse::<u64>()
        .map_err(|_| format!("SEED: {seed:?} is not a whole number"))?;
    Ok((
        [
            count("CLUSTERS", clusters)?,
            count("NODES", nodes)?,
            count("JOBS", jobs)?,
        ],
        seed,
        scheduler,
    ))
}
