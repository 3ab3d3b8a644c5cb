//! Small helpers: running commands with a readable failure, the workspace root, root check,
//! and a minimal HTTP GET (so the demo needs no curl).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Whether the effective user is root.
pub fn is_root() -> bool {
    // SAFETY: plain getter.
    unsafe { libc::geteuid() == 0 }
}

/// The command line of `cmd` as a shell would show it, environment overrides first.
pub fn describe(cmd: &Command) -> String {
    let mut parts: Vec<String> = Vec::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            parts.push(format!(
                "{}={}",
                k.to_string_lossy(),
                quote(&v.to_string_lossy())
            ));
        }
    }
    parts.push(quote(&cmd.get_program().to_string_lossy()));
    parts.extend(cmd.get_args().map(|a| quote(&a.to_string_lossy())));
    parts.join(" ")
}

fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:+,@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` with inherited stdio; on failure prints `failed: <command> (<status>)` and
/// returns an error.
pub fn run_inherit(cmd: &mut Command) -> Result<()> {
    let shown = describe(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{shown}`"));
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => {
            println!("failed: {shown} ({s})");
            bail!("`{shown}` failed ({s})")
        }
        Err(e) => {
            println!("failed: {shown} ({e:#})");
            Err(e)
        }
    }
}

/// Runs `program args` quietly and returns its output, or `None` when it cannot start.
pub fn output<I, S>(program: &str, args: I) -> Option<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(program).args(args).output().ok()
}

/// `GET path` over HTTP/1.0 (so the body is never chunked). Returns the status code and body.
///
/// # Errors
/// Connection refused or timed out, or an unparsable response.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of HTTP headers")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status code")?;
    Ok((code, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_quotes_what_needs_it() {
        let mut c = Command::new("apt-get");
        c.args(["install", "-y", "a b"])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22");
        assert_eq!(
            describe(&c),
            "LLVM_PREFIX=/usr/lib/llvm-22 apt-get install -y 'a b'"
        );
    }

    #[test]
    fn http_get_reads_status_and_body() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            while !got.ends_with(b"\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "request cut short: {got:?}");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got.starts_with(b"GET /healthz HTTP/1.0\r\n"));
            c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                .unwrap();
        });
        let (code, body) = http_get(addr, "/healthz", Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        assert_eq!((code, body.as_str()), (200, "ok\n"));
    }
}
