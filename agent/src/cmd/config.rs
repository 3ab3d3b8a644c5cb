//! The `uvmwatch run` configuration file (`--config FILE`, TOML).
//!
//! Every key is a long flag of `uvmwatch run` (or a global flag) without the leading `--`:
//! `listen = "0.0.0.0:19400"`, `cuinit-stall = "20s"`, `libcuda = ["/a", "/b"]` for a
//! repeatable flag, `no-proc-scan = true` for a switch. Precedence: defaults < file <
//! environment < flags. The file's values are turned into command-line arguments only for
//! the flags that neither the command line nor the environment set, so clap parses and
//! checks them exactly like flags. Unknown keys and values of the wrong kind are errors that
//! name the key and the file.

use std::{collections::BTreeMap, ffi::OsString, path::Path};

use anyhow::{anyhow, bail, Context, Result};
use clap::{parser::ValueSource, ArgMatches, Command};

/// Where a value of the effective configuration came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The flag's default.
    Default,
    /// The configuration file.
    File,
    /// An environment variable (named).
    Env(String),
    /// The command line.
    Flag,
}

/// One value of the file, as the argument string it becomes and the TOML kind it had.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// The argument text (`20s`, `/usr/lib/libcuda.so.1`, `5`).
    pub text: String,
    /// It was a TOML number (only numeric flags take one: `libcuda = 5` is not the path "5").
    pub number: bool,
}

/// The file's entries: key -> values (one per repetition; empty for a switch that is on).
/// Switches set to `false` are left out.
///
/// # Errors
/// Not TOML, a nested table, or a value that is not a string, integer, float, boolean or
/// an array of those.
pub fn parse(text: &str, file: &Path) -> Result<BTreeMap<String, Vec<Value>>> {
    let table: toml::Table =
        toml::from_str(text).with_context(|| format!("{}: not valid TOML", file.display()))?;
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let scalar = |v: &toml::Value| -> Result<Value> {
            let (text, number) = match v {
                toml::Value::String(s) => (s.clone(), false),
                toml::Value::Integer(i) => (i.to_string(), true),
                // `driver-version = 535.10` is a TOML float, 535.1: the digits are lost.
                toml::Value::Float(_) if key == "driver-version" => bail!(
                    "{}: key `driver-version`: write the version as a string, e.g. driver-version = \"535.104.05\"",
                    file.display()
                ),
                toml::Value::Float(f) => (f.to_string(), true),
                toml::Value::Boolean(b) => (b.to_string(), false),
                _ => bail!(
                    "{}: key `{key}`: expected a string, number or boolean",
                    file.display()
                ),
            };
            Ok(Value { text, number })
        };
        let values = match &value {
            toml::Value::Boolean(true) => vec![],
            toml::Value::Boolean(false) => continue,
            toml::Value::Array(items) => items.iter().map(scalar).collect::<Result<Vec<_>>>()?,
            v => vec![scalar(v)?],
        };
        out.insert(key, values);
    }
    Ok(out)
}

/// Whether `arg` takes a number (its value parser makes an integer or a float).
fn takes_number(arg: &clap::Arg) -> bool {
    use std::any::TypeId;
    let t = arg.get_value_parser().type_id();
    [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f64>(),
    ]
    .iter()
    .any(|n| t == *n)
}

/// Adds the configuration file's values (from `--config FILE` or `UVMWATCH_CONFIG`, for the
/// `run` subcommand) to `args`, for every flag not already set on the command line or by
/// its environment variable. Returns the new arguments and the keys that came from the file.
///
/// # Errors
/// The file cannot be read or parsed, a key is not a flag of `uvmwatch run`, a switch is
/// given a non-boolean value, a number is given to a flag that does not take one, or a value
/// the flag refuses (a zero duration, an address that does not parse, a flag that needs
/// another): each names the key and the file.
pub fn apply(cmd: Command, args: Vec<OsString>) -> Result<(Vec<OsString>, Vec<String>)> {
    let matches = match cmd.clone().try_get_matches_from(&args) {
        Ok(m) => m,
        // Let clap report bad arguments itself when the caller parses.
        Err(_) => return Ok((args, Vec::new())),
    };
    let Some(("run", run)) = matches.subcommand() else {
        return Ok((args, Vec::new()));
    };
    let Some(path) = run.get_one::<std::path::PathBuf>("config").cloned() else {
        return Ok((args, Vec::new()));
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    let entries = parse(&text, &path)?;
    let run_cmd = cmd
        .find_subcommand("run")
        .ok_or_else(|| anyhow!("no run subcommand"))?
        .clone();
    let mut out = args;
    let mut from_file = Vec::new();
    for (key, values) in entries {
        let arg = run_cmd
            .get_arguments()
            .chain(cmd.get_arguments())
            .find(|a| a.get_long() == Some(key.as_str()))
            .ok_or_else(|| {
                anyhow!(
                    "{}: unknown key `{key}` (keys are the long flags of `uvmwatch run`)",
                    path.display()
                )
            })?;
        if key == "config" {
            bail!(
                "{}: `config` cannot be set in the file itself",
                path.display()
            );
        }
        let id = arg.get_id().as_str();
        // Global flags are propagated into the subcommand's matches; ids without a value
        // cannot be asked about (and are not set).
        let source = run
            .ids()
            .any(|i| i.as_str() == id)
            .then(|| run.value_source(id))
            .flatten();
        if matches!(
            source,
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let takes_value = arg.get_action().takes_values();
        if !takes_value && !values.is_empty() {
            bail!(
                "{}: key `{key}` is a switch: write `{key} = true`",
                path.display()
            );
        }
        if takes_value && values.is_empty() {
            bail!("{}: key `{key}` takes a value, not `true`", path.display());
        }
        if let Some(v) = values.iter().find(|v| v.number && !takes_number(arg)) {
            bail!(
                "{}: key `{key}`: expected a string, not the number {}{}",
                path.display(),
                v.text,
                if arg.get_value_parser().type_id() == std::any::TypeId::of::<std::time::Duration>()
                {
                    format!(" (a duration with its unit, e.g. {key} = \"{}s\")", v.text)
                } else {
                    format!(" (write {key} = \"{}\" if that is meant)", v.text)
                }
            );
        }
        if values.is_empty() {
            out.push(format!("--{key}").into());
        } else {
            for v in values {
                out.push(format!("--{key}={}", v.text).into());
            }
        }
        from_file.push(key);
    }
    // The file's values are checked here, by the same parser as flags, so that a refused
    // one names its key and the file rather than a flag nobody typed.
    if let Err(e) = cmd.try_get_matches_from(&out) {
        use clap::error::{ContextKind, ContextValue};
        let arg = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(s)) => s.clone(),
            Some(ContextValue::Strings(v)) => v.join(" "),
            _ => String::new(),
        };
        let why = e.render().to_string();
        let why: Vec<&str> = why
            .lines()
            .map(|l| l.trim_start_matches("error: ").trim())
            .take_while(|l| !l.is_empty())
            .collect();
        let why = why.join(" ");
        if let Some(key) = from_file
            .iter()
            .find(|k| arg.split([' ', '=']).next() == Some(format!("--{k}").as_str()))
        {
            bail!("{}: key `{key}`: {why}", path.display());
        }
        // A flag another needs, or two that exclude each other, with some from the file.
        use clap::error::ErrorKind;
        if matches!(
            e.kind(),
            ErrorKind::MissingRequiredArgument | ErrorKind::ArgumentConflict
        ) && !from_file.is_empty()
        {
            bail!(
                "{}: {why} (keys from the file: {})",
                path.display(),
                from_file
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok((out, from_file))
}

/// The effective value and source of every `run` flag, for `uvmwatch run --print-config`.
pub fn describe(cmd: &Command, matches: &ArgMatches, from_file: &[String]) -> String {
    let Some(("run", run)) = matches.subcommand() else {
        return String::new();
    };
    let run_cmd = cmd.find_subcommand("run").cloned().unwrap_or_default();
    let mut lines = Vec::new();
    for arg in run_cmd.get_arguments().chain(cmd.get_arguments()) {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version" | "print-config" | "config") {
            continue;
        }
        let id = arg.get_id().as_str();
        let m = run;
        // Only ids with a value (given or defaulted) can be asked about.
        let present = m.ids().any(|i| i.as_str() == id);
        let source = match present.then(|| m.value_source(id)).flatten() {
            Some(ValueSource::CommandLine) if from_file.iter().any(|k| k == long) => Source::File,
            Some(ValueSource::CommandLine) => Source::Flag,
            Some(ValueSource::EnvVariable) => Source::Env(
                arg.get_env()
                    .map(|e| e.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            _ => Source::Default,
        };
        let value = present
            .then(|| m.get_raw(id))
            .flatten()
            .map(|vs| {
                vs.map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let src = match source {
            Source::Default => "default".to_string(),
            Source::File => "file".to_string(),
            Source::Env(e) => format!("env:{e}"),
            Source::Flag => "flag".to_string(),
        };
        lines.push(format!("{long} = {value:?}  # {src}"));
    }
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scalars_arrays_and_switches() {
        let m = parse(
            "listen = \"127.0.0.1:1\"\ncuinit-stall = \"3s\"\nlibcuda = [\"/a\", \"/b\"]\n\
             no-proc-scan = true\nother = false\nnum = 5\n",
            Path::new("f.toml"),
        )
        .unwrap();
        let texts = |k: &str| m[k].iter().map(|v| v.text.as_str()).collect::<Vec<_>>();
        assert_eq!(texts("listen"), vec!["127.0.0.1:1"]);
        assert_eq!(texts("libcuda"), vec!["/a", "/b"]);
        assert!(m["no-proc-scan"].is_empty());
        assert!(!m.contains_key("other"));
        assert_eq!(
            m["num"],
            vec![Value {
                text: "5".into(),
                number: true
            }]
        );
    }

    #[test]
    fn rejects_bad_files() {
        let e = parse("listen = \n", Path::new("f.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("f.toml: not valid TOML"));
        let e = parse("[run]\nlisten = \"x\"\n", Path::new("f.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("key `run`"));
    }
}
