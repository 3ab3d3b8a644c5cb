//! Behaviour rules of the fake device server, shared by `uvmwatch-fakedev` (which parses
//! them from its command line) and [`crate::FakeDevConfig`] (which renders them into it).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Error for a rule, node name or errno that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseRuleError(String);

impl fmt::Display for ParseRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseRuleError {}

fn err(msg: impl Into<String>) -> ParseRuleError {
    ParseRuleError(msg.into())
}

/// Alternative names Linux's `errno.h` gives to the same value (`errno_name` prints the
/// first name of each value, as `nix` lists them).
const ERRNO_ALIASES: &[(&str, i32)] = &[
    ("ENOTSUP", libc::ENOTSUP),
    ("EWOULDBLOCK", libc::EWOULDBLOCK),
    ("EDEADLOCK", libc::EDEADLOCK),
];

/// Parses an errno given by name (`EPERM`, case-insensitive) or by positive number (`1`).
///
/// # Errors
/// Unknown names, zero and negative numbers.
pub fn parse_errno(s: &str) -> Result<i32, ParseRuleError> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return if n > 0 {
            Ok(n)
        } else {
            Err(err(format!("errno must be positive, got {n}")))
        };
    }
    ERRNO_ALIASES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s))
        .map(|&(_, n)| n)
        .or_else(|| (1..4096).find(|&n| errno_name(n).is_some_and(|e| e.eq_ignore_ascii_case(s))))
        .ok_or_else(|| err(format!("unknown errno name '{s}'")))
}

/// The symbolic name of an errno (`EPERM` for 1), from Linux's list as `nix` keeps it.
pub fn errno_name(errno: i32) -> Option<String> {
    let e = nix::errno::Errno::from_raw(errno);
    (e != nix::errno::Errno::UnknownErrno).then(|| format!("{e:?}"))
}

/// Parses an ioctl command number: hexadecimal with `0x` (`0x25`, `0xC020462A`) or decimal.
///
/// # Errors
/// Anything that is not a `u32`.
pub fn parse_cmd(s: &str) -> Result<u32, ParseRuleError> {
    let s = s.trim();
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse::<u32>(),
    };
    parsed.map_err(|_| err(format!("bad ioctl command number '{s}'")))
}

/// What the fake device does with an ioctl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoctlAction {
    /// Answer at once with success (syscall returns 0); `_IOC` parameters are echoed back.
    Ok,
    /// Fail the syscall with this errno (positive, e.g. `libc::EIO`).
    Errno(i32),
    /// Answer with success after this long; other requests keep being served meanwhile.
    /// `SIGUSR1` to the server answers it early.
    Delay(Duration),
    /// Never answer until the server gets `SIGUSR1` (then success), or the caller is
    /// interrupted (then the syscall fails with `EINTR`).
    Hang,
}

impl fmt::Display for IoctlAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoctlAction::Ok => f.write_str("ok"),
            IoctlAction::Errno(e) => match errno_name(*e) {
                Some(name) => write!(f, "errno:{name}"),
                None => write!(f, "errno:{e}"),
            },
            IoctlAction::Delay(d) => write!(f, "delay:{}", d.as_millis()),
            IoctlAction::Hang => f.write_str("hang"),
        }
    }
}

impl FromStr for IoctlAction {
    type Err = ParseRuleError;

    /// `ok`, `errno:NAME|N`, `delay:MS` (milliseconds) or `hang`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("ok") {
            return Ok(IoctlAction::Ok);
        }
        if s.eq_ignore_ascii_case("hang") {
            return Ok(IoctlAction::Hang);
        }
        if let Some(e) = s.strip_prefix("errno:") {
            return parse_errno(e).map(IoctlAction::Errno);
        }
        if let Some(ms) = s.strip_prefix("delay:") {
            let ms: u64 = ms
                .trim()
                .parse()
                .map_err(|_| err(format!("bad delay '{ms}' (milliseconds expected)")))?;
            return Ok(IoctlAction::Delay(Duration::from_millis(ms)));
        }
        Err(err(format!(
            "bad ioctl action '{s}' (ok, errno:NAME|N, delay:MS or hang)"
        )))
    }
}

/// One `--ioctl CMD=ACTION` rule: what to do with ioctl command `cmd` on any node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlRule {
    /// The ioctl request number exactly as passed to `ioctl(2)` (e.g. `0x25`, `0x30000001`).
    pub cmd: u32,
    /// What to do with it.
    pub action: IoctlAction,
}

impl IoctlRule {
    /// A rule for `cmd`.
    pub fn new(cmd: u32, action: IoctlAction) -> Self {
        IoctlRule { cmd, action }
    }
}

impl fmt::Display for IoctlRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}={}", self.cmd, self.action)
    }
}

impl FromStr for IoctlRule {
    type Err = ParseRuleError;

    /// `CMD=ACTION`, e.g. `0x25=hang`, `0x30000001=errno:EAGAIN`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (cmd, action) = s
            .split_once('=')
            .ok_or_else(|| err(format!("ioctl rule '{s}' is not CMD=ACTION")))?;
        Ok(IoctlRule {
            cmd: parse_cmd(cmd)?,
            action: action.parse()?,
        })
    }
}

/// One `--deny NAME=ERRNO` rule: opening node `node` fails with `errno`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenDenial {
    /// Node name without `/dev/`, e.g. `nvidia-uvm`.
    pub node: String,
    /// Positive errno the `open` fails with, e.g. `libc::EPERM`.
    pub errno: i32,
}

impl OpenDenial {
    /// Denies opening `node` with `errno`.
    pub fn new(node: impl Into<String>, errno: i32) -> Self {
        OpenDenial {
            node: node.into(),
            errno,
        }
    }
}

impl fmt::Display for OpenDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match errno_name(self.errno) {
            Some(name) => write!(f, "{}={name}", self.node),
            None => write!(f, "{}={}", self.node, self.errno),
        }
    }
}

impl FromStr for OpenDenial {
    type Err = ParseRuleError;

    /// `NAME=ERRNO`, e.g. `nvidia-uvm=EPERM` or `nvidia0=5`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (node, errno) = s
            .split_once('=')
            .ok_or_else(|| err(format!("deny rule '{s}' is not NAME=ERRNO")))?;
        let node = node.trim();
        if node.is_empty() || node.contains('/') {
            return Err(err(format!("bad node name '{node}'")));
        }
        Ok(OpenDenial {
            node: node.to_string(),
            errno: parse_errno(errno)?,
        })
    }
}

/// Names (under `/dev`) of every node a machine with `gpus` GPUs has, in the order the
/// server lists them: `nvidiactl`, `nvidia0`..`nvidia{gpus-1}`, `nvidia-uvm`,
/// `nvidia-uvm-tools`.
pub fn all_node_names(gpus: u32) -> Vec<String> {
    let mut names = vec!["nvidiactl".to_string()];
    names.extend((0..gpus).map(|i| format!("nvidia{i}")));
    names.push("nvidia-uvm".to_string());
    names.push("nvidia-uvm-tools".to_string());
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_renders_rules() {
        let r: IoctlRule = "0x25=hang".parse().unwrap();
        assert_eq!(r, IoctlRule::new(0x25, IoctlAction::Hang));
        assert_eq!(r.to_string(), "0x25=hang");
        let r: IoctlRule = "0x30000001=errno:eagain".parse().unwrap();
        assert_eq!(r.action, IoctlAction::Errno(libc::EAGAIN));
        assert_eq!(r.to_string(), "0x30000001=errno:EAGAIN");
        let r: IoctlRule = "0xC020462A=delay:250".parse().unwrap();
        assert_eq!(r.cmd, 0xC020_462A);
        assert_eq!(r.action, IoctlAction::Delay(Duration::from_millis(250)));
        assert_eq!(r.to_string().parse::<IoctlRule>().unwrap(), r);
        assert_eq!(
            "39=errno:77".parse::<IoctlRule>().unwrap(),
            IoctlRule::new(39, IoctlAction::Errno(77))
        );
        assert!("0x25".parse::<IoctlRule>().is_err());
        assert!("0x25=sleep".parse::<IoctlRule>().is_err());
        assert!("0xZZ=ok".parse::<IoctlRule>().is_err());
        assert!("0x25=errno:0".parse::<IoctlRule>().is_err());
    }

    #[test]
    fn parses_denials() {
        let d: OpenDenial = "nvidia-uvm=EPERM".parse().unwrap();
        assert_eq!(d, OpenDenial::new("nvidia-uvm", libc::EPERM));
        assert_eq!(d.to_string(), "nvidia-uvm=EPERM");
        assert_eq!("nvidia0=13".parse::<OpenDenial>().unwrap().errno, 13);
        assert!("nvidia0".parse::<OpenDenial>().is_err());
        assert!("a/b=EPERM".parse::<OpenDenial>().is_err());
        assert!("nvidia0=EWHAT".parse::<OpenDenial>().is_err());
    }

    #[test]
    fn node_names() {
        assert_eq!(
            all_node_names(2),
            [
                "nvidiactl",
                "nvidia0",
                "nvidia1",
                "nvidia-uvm",
                "nvidia-uvm-tools"
            ]
        );
    }
}
