//! The `/dev/nvidia*` nodes: type, device number and the collector's own open of each, and
//! the NVSwitch nodes.

use super::super::facts::{DevNode, Fact};
use super::super::root::{FileKind, Root};
use super::why_unreadable;

/// `/dev/nvidia*` (each `stat`ed and, where the root allows it, opened once) and
/// `/dev/nvidia-nvswitch*` (only `stat`ed), from one listing of `/dev`.
pub(super) fn collect_dev_nodes(root: &Root) -> (Fact<Vec<DevNode>>, Fact<Vec<String>>) {
    const NODES: &str = "/dev/nvidia*";
    const SWITCHES: &str = "/dev/nvidia-nvswitch*";
    let names = match root.read_dir("/dev") {
        Ok(names) => names,
        Err(err) => {
            let why = why_unreadable(&err, None);
            return (
                Fact::unavailable(why.clone(), NODES),
                Fact::unavailable(why, SWITCHES),
            );
        }
    };
    let mut nodes = Vec::new();
    let mut switches = Vec::new();
    for name in names.iter().filter(|n| n.starts_with("nvidia")) {
        let path = format!("/dev/{name}");
        if name.starts_with("nvidia-nvswitch") {
            // Not opened (the fabric manager owns them); the stat keeps them in a bundle.
            let _ = root.metadata(&path);
            switches.push(path);
            continue;
        }
        // `/dev/nvidia-caps/` and `/dev/nvidia-caps-imex-channels/` hold capability nodes.
        if name.starts_with("nvidia-caps") {
            continue;
        }
        let dev = match root.metadata(&path) {
            Ok(meta) if meta.kind == FileKind::Char => meta.dev,
            _ => None,
        };
        // Tried for every entry: a directory or plain file where a node should be (a bind
        // mount of a missing node) or a dangling link gives a telling errno too.
        let open = root.open_device(&path);
        nodes.push(DevNode { path, dev, open });
    }
    (Fact::ok(nodes, NODES), Fact::ok(switches, SWITCHES))
}
