//! The last line of defence against leaked processes: a second copy of the test binary that
//! outlives it. The test process tells it, over a pipe, which processes it started and which
//! directories it made; when the pipe closes (the test process ended, however it ended: a
//! panic, a signal, SIGKILL), the reaper kills whatever is still registered and removes the
//! directories. A normal exit unregisters everything first, so then it does nothing.
//!
//! The test binary's `main` calls [`run_if_reaper`] first; [`start`] spawns the reaper.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;

const REAPER_ENV: &str = "SWITCHYARD_K8S_REAPER";

static PIPE: Mutex<Option<ChildStdin>> = Mutex::new(None);

/// Runs the reaper and exits when this process was started as one.
pub fn run_if_reaper() {
    if std::env::var_os(REAPER_ENV).is_none() {
        return;
    }
    let mut pids = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let (what, arg) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match what {
            "+pid" => {
                pids.insert(arg.to_string());
            }
            "-pid" => {
                pids.remove(arg);
            }
            "+dir" => {
                dirs.insert(PathBuf::from(arg));
            }
            "-dir" => {
                dirs.remove(Path::new(arg));
            }
            _ => {}
        }
    }
    for pid in &pids {
        let _ = Command::new("kill")
            .args(["-KILL", pid])
            .stderr(Stdio::null())
            .status();
    }
    if !pids.is_empty() {
        // Let the killed processes let go of their files.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    std::process::exit(0);
}

/// Starts the reaper for this process. Its own process group keeps a Ctrl-C in the terminal
/// from stopping it before it has cleaned up.
pub fn start() -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("the test binary's path: {e}"))?;
    let mut child = Command::new(exe)
        .env(REAPER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the reaper: {e}"))?;
    *PIPE.lock().unwrap() = child.stdin.take();
    // Nobody waits for it: it exits once the pipe closes, when this process is done.
    drop(child);
    Ok(())
}

/// Closes the pipe: the reaper cleans up what is still registered and exits.
pub fn stop() {
    PIPE.lock().unwrap().take();
}

fn tell(line: String) {
    if let Some(pipe) = PIPE.lock().unwrap().as_mut() {
        let _ = writeln!(pipe, "{line}");
        let _ = pipe.flush();
    }
}

pub fn watch_pid(pid: u32) {
    tell(format!("+pid {pid}"));
}

pub fn forget_pid(pid: u32) {
    tell(format!("-pid {pid}"));
}

pub fn watch_dir(dir: &Path) {
    tell(format!("+dir {}", dir.display()));
}

pub fn forget_dir(dir: &Path) {
    tell(format!("-dir {}", dir.display()));
}
