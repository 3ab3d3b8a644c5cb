//! Running a command of the live machine with a time limit (`nvidia-smi -q`, `dmesg`), and
//! [`CommandError`], why a command (live or from a snapshot) gave no output.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::doctor::input::{
    clip, into_text, read_stream_limited, LimitedRead, Overflow, ReadLimit,
};

/// How long [`Root::command`](super::Root::command) lets a live command run before killing it (10 s). A hung
/// driver makes `nvidia-smi` block; the doctor must still finish.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How the text of a [`CommandError::TimedOut`] starts: a fact read from a command that did
/// not answer in time says so with this verdict (the rules tell a timeout from the rest by
/// it, [`timed_out`]).
pub const TIMED_OUT_VERDICT: &str = "no answer:";

/// Whether the reason a command's output is missing (a [`CommandError`]'s text) is that
/// it did not finish in time.
pub fn timed_out(why: &str) -> bool {
    why.starts_with(TIMED_OUT_VERDICT)
}

/// Why [`Root::command`](super::Root::command) or [`Root::kernel_log`](super::Root::kernel_log) gave no output. The `Display` text is
/// meant for users and starts with a short verdict (`not present:`, `failed:`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum CommandError {
    /// The program is not installed (`execve` gave `ENOENT` for every `PATH` entry).
    NotInstalled {
        /// Command line, e.g. `nvidia-smi -q`.
        command: String,
    },
    /// A snapshot without this command's output.
    NotCaptured {
        /// Command line.
        command: String,
    },
    /// Killed after [`COMMAND_TIMEOUT`].
    TimedOut {
        /// Command line.
        command: String,
        /// Seconds it was given.
        seconds: u64,
    },
    /// Exited with a non-zero status or was killed by a signal.
    Failed {
        /// Command line.
        command: String,
        /// `exit status 9`, `signal 9`, ...
        status: String,
        /// Its output (stdout then stderr), at most 2000 characters.
        output: String,
    },
    /// It could not be started or read for another reason.
    Io {
        /// Command line.
        command: String,
        /// The error as printed.
        error: String,
    },
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::NotInstalled { command } => {
                let program = command.split_whitespace().next().unwrap_or(command);
                write!(
                    f,
                    "not present: {program} is not installed here (not found in PATH)"
                )
            }
            CommandError::NotCaptured { command } => {
                write!(f, "not captured: the snapshot has no output of `{command}`")
            }
            CommandError::TimedOut { command, seconds } => write!(
                f,
                "{TIMED_OUT_VERDICT} `{command}` did not finish within {seconds} s (a hung driver does this)"
            ),
            CommandError::Failed {
                command,
                status,
                output,
            } => {
                let output = output.trim();
                if output.is_empty() {
                    write!(f, "failed: `{command}` ended with {status}")
                } else {
                    write!(f, "failed: `{command}` ended with {status}: {output}")
                }
            }
            CommandError::Io { command, error } => {
                write!(f, "not readable: `{command}`: {error}")
            }
        }
    }
}

impl std::error::Error for CommandError {}

/// `name args...` joined with spaces.
pub(super) fn command_line(name: &str, args: &[&str]) -> String {
    std::iter::once(name)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Most output kept of a failed command, in characters.
const FAILED_OUTPUT_CHARS: usize = 2000;

/// Most of a command's standard error kept (the newest part): only its start is shown.
const STDERR_LIMIT: ReadLimit = ReadLimit {
    bytes: 64 * 1024,
    overflow: Overflow::KeepNewest,
};

/// Runs `name args...` for at most `timeout`, its standard output read with `limit`.
/// Returns the output and how many bytes of it were left out at its start (only with
/// [`Overflow::KeepNewest`]).
pub(super) fn run_command(
    name: &str,
    args: &[&str],
    timeout: Duration,
    limit: ReadLimit,
) -> Result<(String, u64), CommandError> {
    let line = command_line(name, args);
    let mut child = Command::new(name)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| {
            // `execvp` reports EACCES, not ENOENT, when some PATH directory could not be
            // searched (e.g. /root/... for an unprivileged user): look for the program.
            let absent = err.kind() == io::ErrorKind::NotFound
                || (err.kind() == io::ErrorKind::PermissionDenied && !on_path(name));
            if absent {
                CommandError::NotInstalled {
                    command: line.clone(),
                }
            } else {
                CommandError::Io {
                    command: line.clone(),
                    error: err.to_string(),
                }
            }
        })?;
    let stdout = drain(child.stdout.take(), limit);
    let stderr = drain(child.stderr.take(), STDERR_LIMIT);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                // A process stuck in the kernel (D state) is not reaped until it leaves it:
                // do not wait for it.
                let _ = child.try_wait();
                return Err(CommandError::TimedOut {
                    command: line,
                    seconds: timeout.as_secs(),
                });
            }
            Ok(None) => thread::sleep(Duration::from_millis(10)),
            Err(err) => {
                return Err(CommandError::Io {
                    command: line,
                    error: err.to_string(),
                })
            }
        }
    };
    // The pipes close when the command exits (unless it left a child holding them).
    let out = match stdout.recv_timeout(Duration::from_secs(1)) {
        Ok(Ok(read)) => read,
        Ok(Err(err)) => {
            return Err(CommandError::Io {
                command: line,
                error: err.to_string(),
            })
        }
        Err(_) => LimitedRead::default(),
    };
    let err = match stderr.recv_timeout(Duration::from_secs(1)) {
        Ok(Ok(read)) => read.bytes,
        _ => Vec::new(),
    };
    let dropped = out.dropped;
    let out = into_text(out.bytes);
    if status.success() {
        return Ok((out, dropped));
    }
    let status_text = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "an unknown status".to_string(),
    };
    let mut output = out;
    output.push_str(&String::from_utf8_lossy(&err));
    let output = clip(output.trim(), FAILED_OUTPUT_CHARS);
    Err(CommandError::Failed {
        command: line,
        status: status_text,
        output,
    })
}

/// Whether `name` exists as a file: the path itself when it holds a `/`, else in one of
/// the `PATH` directories.
fn on_path(name: &str) -> bool {
    if name.contains('/') {
        return Path::new(name).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// Reads a pipe to its end on a helper thread, keeping what `limit` allows.
fn drain<R: Read + Send + 'static>(
    pipe: Option<R>,
    limit: ReadLimit,
) -> mpsc::Receiver<io::Result<LimitedRead>> {
    let (tx, rx) = mpsc::channel();
    if let Some(pipe) = pipe {
        thread::spawn(move || {
            let _ = tx.send(read_stream_limited(pipe, limit));
        });
    } else {
        let _ = tx.send(Ok(LimitedRead::default()));
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::super::Root;
    use super::*;

    #[test]
    fn live_commands() {
        let root = Root::live(None);
        assert_eq!(root.command("echo", &["a", "b"]).unwrap(), "a b\n");
        let err = root
            .command("uvmwatch-no-such-program", &["-q"])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not present: uvmwatch-no-such-program is not installed here (not found in PATH)"
        );
        match root
            .command("sh", &["-c", "echo oops >&2; exit 9"])
            .unwrap_err()
        {
            CommandError::Failed { status, output, .. } => {
                assert_eq!(status, "exit status 9");
                assert_eq!(output, "oops");
            }
            other => panic!("{other:?}"),
        }
        let big = root
            .command("sh", &["-c", "head -c 300000 /dev/zero | tr '\\0' x"])
            .unwrap();
        assert_eq!(big.len(), 300_000);
        // Past its limit an output is refused, or only its newest lines are kept.
        let refuse = ReadLimit {
            bytes: 1000,
            overflow: Overflow::Refuse,
        };
        let seq = ["-c", "seq 1 100000"];
        let err = run_command("sh", &seq, COMMAND_TIMEOUT, refuse).unwrap_err();
        assert_eq!(
            err.to_string(),
            "not readable: `sh -c seq 1 100000`: too large (over 1000 bytes, the limit)"
        );
        let newest = ReadLimit {
            bytes: 14,
            overflow: Overflow::KeepNewest,
        };
        let (text, dropped) = run_command("sh", &seq, COMMAND_TIMEOUT, newest).unwrap();
        assert_eq!(text, "99999\n100000\n");
        assert_eq!(dropped, 588_895 - 13);
        let started = Instant::now();
        let limit = crate::doctor::input::COMMAND_OUTPUT_LIMIT;
        let err = run_command("sleep", &["30"], Duration::from_millis(200), limit).unwrap_err();
        assert!(matches!(err, CommandError::TimedOut { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
