//! A child process of a test: its output in a log file, signals by pid, and killed when
//! dropped (and by the reaper if this process dies first).

use super::reaper;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

pub struct Process {
    name: String,
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
}

impl Process {
    /// Waits (up to 60 s) until the process answers 200 on `GET /readyz` at `health`; says why
    /// not, with the end of its log, when it exits first or never does.
    pub async fn ready(&mut self, health: std::net::SocketAddr) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !http_ok(health, "/readyz").await {
            if let Some(status) = self.exited() {
                return Err(format!(
                    "{} exited ({status}) while starting; its log ends:\n{}",
                    self.name(),
                    self.log_tail(20)
                ));
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "{}: /readyz not ok within 60 s; its log ends:\n{}",
                    self.name(),
                    self.log_tail(20)
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Starts `command`, its stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Self, String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{name}: cannot open its log {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{name}: log {}: {e}", log.display()))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {name} ({command:?}): {e}"))?;
        let pid = child.id();
        reaper::watch_pid(pid);
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            pid,
            log: log.to_path_buf(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status, if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`...) with kill(1): std has no safe call
    /// for signals other than SIGKILL, and the crate forbids unsafe code.
    pub fn signal(&self, signal: &str) -> Result<(), String> {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status()
            .map_err(|e| format!("kill -{signal} {} ({}): {e}", self.pid, self.name))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "kill -{signal} {} ({}): {status}",
                self.pid, self.name
            ))
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            reaper::forget_pid(self.pid);
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a plain HTTP GET of `path` answers 200.
pub async fn http_ok(addr: std::net::SocketAddr, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut reply = Vec::new();
    if tcp.write_all(request.as_bytes()).await.is_err()
        || tcp.read_to_end(&mut reply).await.is_err()
    {
        return false;
    }
    reply.starts_with(b"HTTP/1.1 200")
}
