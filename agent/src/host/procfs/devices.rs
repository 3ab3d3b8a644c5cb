//! `/proc/devices`: the character majors the NVIDIA modules registered (`nvidia-uvm`'s is
//! dynamic: the kernel side needs it to know its opens, the doctor to check the nodes).

use std::collections::BTreeMap;

use crate::decode::text::quote;

/// `/proc/devices` (`fs/proc/devices.c`).
pub const DEVICES_PATH: &str = "/proc/devices";

/// Majors by name from the `Character devices:` section of `/proc/devices`, for names
/// starting with `nvidia` (`nvidia-frontend` 195, `nvidia-uvm` (dynamic), `nvidia-nvswitch`,
/// `nvidia-caps`, ...). The `Block devices:` section is ignored. Empty text (no character
/// device registered at all) gives an empty map.
///
/// Errors: a non-empty line before the first section header, or one that is not
/// `<major> <name>` (the kernel's `"%3d %s\n"`), named by its line number and quoted.
pub fn parse_devices(text: &str) -> Result<BTreeMap<String, u32>, String> {
    let mut out = BTreeMap::new();
    let mut in_char = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if line.ends_with("devices:") {
            in_char = Some(line == "Character devices:");
            continue;
        }
        let entry = line
            .split_once(char::is_whitespace)
            .and_then(|(major, name)| Some((major.parse::<u32>().ok()?, name.trim())))
            .filter(|(_, name)| !name.is_empty() && in_char.is_some());
        let Some((major, name)) = entry else {
            return Err(format!(
                "line {} is not `<major> <name>` under a `... devices:` header: {}",
                n + 1,
                quote(raw)
            ));
        };
        if in_char == Some(true) && name.starts_with("nvidia") {
            out.insert(name.to_string(), major);
        }
    }
    Ok(out)
}
