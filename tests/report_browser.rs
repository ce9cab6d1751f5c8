//! `simulate --report` of the bundled example opened in a real browser: headless Chromium
//! (Debian's `chromium` package) loads the page with no console message, its DOM as parsed
//! has every chart with one series per strategy, and a screenshot is written under
//! `target/tmp/report-browser/`.
//!
//! Chromium comes from `SWITCHYARD_CHROMIUM`, else `chromium` on the PATH. Without it this
//! test prints one skip line and passes, unless `SWITCHYARD_REQUIRE_CHROMIUM=1` (which
//! `.ci/run` sets when it finds Chromium).
//!
//! Console errors: the page has no script, and its Content-Security-Policy forbids fetching
//! anything, so what could go wrong in a browser (a load attempted, an SVG attribute that
//! does not parse, a script slipped in) shows as a console message. Chromium run with
//! `--enable-logging=stderr --v=0` writes every console message, whatever its level, as a
//! `…:CONSOLE…` line on stderr; none may appear. A page that does log one is checked the same
//! way first, so a Chromium that stopped logging them would fail this test, not pass it.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard::simulate::{scenario, Strategy};

fn chromium() -> Option<String> {
    let required = std::env::var("SWITCHYARD_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    let candidate = std::env::var("SWITCHYARD_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    match Command::new(&candidate).arg("--version").output() {
        Ok(out) if out.status.success() => Some(candidate),
        other => {
            let why = match other {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
                Err(e) => format!("{candidate}: {e}"),
            };
            assert!(
                !required,
                "SWITCHYARD_REQUIRE_CHROMIUM=1 but Chromium does not run ({why})"
            );
            // Straight to stderr: the test harness captures eprintln! of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "report_browser: skipped: no Chromium ({why}); apt-get install chromium, or set SWITCHYARD_CHROMIUM"
            );
            None
        }
    }
}

/// What Chromium wrote: stdout (the DOM, with `--dump-dom`) and stderr (its log).
struct Run {
    stdout: String,
    stderr: String,
}

/// Chromium headless on `page` with `args`, its own profile in `dir`, killed after a minute.
/// Its output goes to files: a page's DOM fills a pipe nobody reads while it runs.
fn headless(chromium: &str, dir: &Path, page: &Path, args: &[&str]) -> Run {
    let (out_path, err_path) = (dir.join("chromium.out"), dir.join("chromium.err"));
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("Chromium did not finish with {page:?} in a minute");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let run = Run {
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
    };
    assert!(status.success(), "{}", run.stderr);
    run
}

fn console_lines(run: &Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .collect()
}

#[test]
fn the_bundled_example_s_report_loads_in_chromium_with_every_chart_and_no_console_message() {
    let Some(chromium) = chromium() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report-browser");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    // The check catches a console message when there is one.
    let control = dir.join("control.html");
    std::fs::write(
        &control,
        "<!DOCTYPE html><html lang=\"en\"><head><title>control</title></head><body>\
         <script>console.error('control-marker')</script></body></html>",
    )
    .unwrap();
    let out = headless(&chromium, &dir, &control, &["--dump-dom"]);
    assert!(
        console_lines(&out)
            .iter()
            .any(|l| l.contains("control-marker")),
        "Chromium no longer logs console messages this way:\n{}",
        out.stderr
    );

    let page = dir.join("report.html");
    let run = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["simulate", "--strategy", "all", "--report"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let out = headless(&chromium, &dir, &page, &["--dump-dom"]);
    assert_eq!(console_lines(&out), Vec::<&str>::new());
    let dom = out.stdout;

    // The charts as the browser parsed them: one per cluster and resource some Job requests,
    // one per queue and kind of Jobs waiting, start waits overall and per kind, the gangs'
    // timeline; each with a series per strategy.
    let scenario = scenario::parse(scenario::BUNDLED).unwrap();
    let inv = &scenario.inventory;
    let requested: std::collections::BTreeSet<&String> = scenario
        .jobs
        .iter()
        .flat_map(|j| j.pod.node_request.keys())
        .collect();
    let capacity = inv
        .clusters
        .iter()
        .map(|c| {
            requested
                .iter()
                .filter(|r| {
                    let id = inv.resources.id(r).unwrap();
                    c.nodes
                        .iter()
                        .any(|n| n.allocatable.get(id).copied().unwrap_or(0) > 0)
                })
                .count()
        })
        .sum::<usize>();
    let kinds: std::collections::BTreeSet<String> = scenario
        .jobs
        .iter()
        .map(|j| {
            j.pod
                .node_request
                .keys()
                .find(|r| r.contains('/'))
                .cloned()
                .unwrap_or_else(|| "cpu-only".into())
        })
        .collect();
    let expected = capacity + (scenario.queues.len() + kinds.len()) + (1 + kinds.len()) + 1;
    let figures: Vec<&str> = dom.split("<figure class=\"chart").skip(1).collect();
    assert_eq!(figures.len(), expected, "charts in the DOM");
    for f in figures {
        let f = &f[..f.find("</figure>").expect("a figure that ends")];
        let id = f.split("id=\"").nth(1).unwrap_or("?");
        let id = &id[..id.find('"').unwrap_or(0)];
        assert_eq!(
            f.matches("<g class=\"series\"").count(),
            Strategy::ALL.len(),
            "{id}"
        );
        for s in Strategy::ALL {
            assert!(f.contains(&format!("data-name=\"{}\"", s.as_str())), "{id}");
        }
        assert!(
            f.contains("<title id=") && f.contains("<figcaption>"),
            "{id}"
        );
    }

    let shot = dir.join("report.png");
    let out = headless(
        &chromium,
        &dir,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1200,1800",
            "--hide-scrollbars",
        ],
    );
    assert_eq!(console_lines(&out), Vec::<&str>::new());
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG at {shot:?}");
}
