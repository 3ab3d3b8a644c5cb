//! Reading NVIDIA's repository: its release tags, their commits, and files at a tag, through
//! one `git cat-file --batch` process per reader (no work tree is needed: a bare git dir or
//! a checkout both work).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{bail, Context, Result};

use super::Version;

/// The repository given with `--source`.
#[derive(Clone, Debug)]
pub struct Repo {
    dir: PathBuf,
}

impl Repo {
    /// Checks that `dir` is a git repository (`git rev-parse --git-dir` succeeds).
    pub fn open(dir: &Path) -> Result<Repo> {
        let repo = Repo {
            dir: dir.to_path_buf(),
        };
        repo.git(&["rev-parse", "--git-dir"])
            .with_context(|| format!("{} is not a git repository", dir.display()))?;
        Ok(repo)
    }

    fn git(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&self.dir)
            .args(args)
            .stderr(Stdio::piped())
            .output()
            .context("cannot run git")?;
        if !out.status.success() {
            bail!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every tag that names a driver release (`515.43.04`, `535.98`, ...) with a major of at
    /// least `min_major`, sorted by version, with the commit each points to.
    pub fn release_tags(&self, min_major: u32) -> Result<Vec<(Version, String)>> {
        let listing = self.git(&[
            "for-each-ref",
            "--format=%(refname:short) %(objectname) %(*objectname)",
            "refs/tags",
        ])?;
        let mut tags = Vec::new();
        for line in listing.lines() {
            let mut f = line.split_whitespace();
            let (Some(name), Some(obj)) = (f.next(), f.next()) else {
                continue;
            };
            // An annotated tag's commit is the peeled object (third field); a light one's is
            // the object itself.
            let commit = f.next().unwrap_or(obj);
            let Some(v) = Version::parse(name) else {
                continue;
            };
            if v.major() >= min_major {
                tags.push((v, commit.to_string()));
            }
        }
        tags.sort();
        Ok(tags)
    }

    /// A reader of files at any commit.
    pub fn reader(&self) -> Result<Reader> {
        let mut child = Command::new("git")
            .arg("-C")
            .arg(&self.dir)
            .args(["cat-file", "--batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start git cat-file --batch")?;
        let stdin = child.stdin.take().context("git cat-file stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("git cat-file stdout")?);
        Ok(Reader {
            child,
            stdin,
            stdout,
        })
    }
}

/// One `git cat-file --batch`: `read(commit, path)` answers the file's bytes or `None`.
pub struct Reader {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Reader {
    /// The text of `path` at `commit`, or `None` when the commit has no such file.
    pub fn read(&mut self, commit: &str, path: &str) -> Result<Option<String>> {
        writeln!(self.stdin, "{commit}:{path}")?;
        self.stdin.flush()?;
        let mut header = String::new();
        self.stdout.read_line(&mut header)?;
        let header = header.trim_end();
        if header.ends_with(" missing") || header.ends_with(" ambiguous") {
            return Ok(None);
        }
        let mut f = header.split(' ');
        let (_, kind, size) = (f.next(), f.next(), f.next());
        let size: usize = size
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("unexpected git cat-file answer {header:?}"))?;
        let mut buf = vec![0u8; size + 1]; // the contents and a newline
        self.stdout.read_exact(&mut buf)?;
        buf.truncate(size);
        if kind != Some("blob") {
            return Ok(None);
        }
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
