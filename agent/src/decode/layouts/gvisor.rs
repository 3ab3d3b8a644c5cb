//! A cross-check of the generated table against an independent implementation: gVisor's
//! nvproxy, which keeps NVIDIA's params structs per driver version.
//!
//! Source: google/gvisor at commit 3c5eee17dc45659fb86843531074f38e78e0cc35:
//! - `pkg/sentry/devices/nvproxy/version.go`: the driver versions nvproxy knows and, for
//!   each, which struct each UVM command and frontend (RM) escape is handled with;
//! - `pkg/abi/nvgpu/uvm.go`, `pkg/abi/nvgpu/frontend.go` (with `Handle`, `P64`, `NvUUID`,
//!   `RS_SHARE_POLICY` of `pkg/abi/nvgpu/nvgpu.go`, and `UVM_MAX_GPUS` = 32,
//!   `UVM_MAX_GPUS_V2` = 256, `NV_DMABUF_EXPORT_MAX_HANDLES` = 128): the structs. Their
//!   sizes and status offsets below were computed from the field lists (the structs use
//!   `structs.HostLayout`, the C layout, with explicit padding); the status offset is that of
//!   the field each struct's `GetStatus` returns.
//!
//! Only these numbers are carried over, no code. The table and gVisor agree on every pair
//! checked (see `gvisor_agrees`); the differences in coverage are listed in
//! docs/compatibility.md.

use super::*;

/// Every version `version.go` registers (`addDriverABI` / `addUnsupportedDriverABI`).
const VERSIONS: &[&str] = &[
    "535.104.05",
    "535.113.01",
    "535.129.03",
    "535.183.06",
    "535.247.01",
    "535.261.03",
    "535.274.02",
    "535.288.01",
    "535.309.01",
    "545.23.06",
    "550.40.07",
    "550.54.14",
    "550.90.07",
    "550.90.12",
    "555.42.02",
    "560.28.03",
    "565.57.01",
    "570.86.15",
    "570.124.06",
    "570.133.20",
    "570.172.08",
    "570.195.03",
    "575.51.02",
    "580.65.06",
    "580.95.05",
    "580.105.08",
    "580.126.09",
    "580.126.20",
    "580.159.03",
    "580.159.04",
    "580.173.02",
    "590.44.01",
    "590.48.01",
    "595.71.05",
    "610.43.02",
    "610.57.04",
    "615.15.00",
    "615.62.00",
    "620.6.00",
];

/// One struct gVisor uses for a command from a version on (until the next entry of the same
/// command and slot).
struct G {
    uvm: bool,
    cmd: u32,
    /// Which of a command's structs: RM_ALLOC has two (NVOS21, NVOS64) at once.
    slot: &'static str,
    /// gVisor's name for the struct.
    gvisor: &'static str,
    since: &'static str,
    size: u32,
    status: Option<u32>,
}

const fn u(cmd: u32, gvisor: &'static str, since: &'static str, size: u32, status: u32) -> G {
    G {
        uvm: true,
        cmd,
        slot: "",
        gvisor,
        since,
        size,
        status: Some(status),
    }
}

const fn r(
    cmd: u32,
    gvisor: &'static str,
    since: &'static str,
    size: u32,
    status: Option<u32>,
) -> G {
    G {
        uvm: false,
        cmd,
        slot: "",
        gvisor,
        since,
        size,
        status,
    }
}

const BASE: &str = "535.104.05";

/// The structs, from the version they are first used with. `UVM_TOOLS_READ/WRITE_PROCESS_MEMORY`
/// are defined in uvm.go but not bound in version.go: taken as valid from the base version.
const STRUCTS: &[G] = &[
    u(0x3000_0001, "UVM_INITIALIZE_PARAMS", BASE, 16, 8),
    u(0x17, "UVM_CREATE_RANGE_GROUP_PARAMS", BASE, 16, 8),
    u(0x18, "UVM_DESTROY_RANGE_GROUP_PARAMS", BASE, 16, 8),
    u(0x19, "UVM_REGISTER_GPU_VASPACE_PARAMS", BASE, 32, 28),
    u(0x1a, "UVM_UNREGISTER_GPU_VASPACE_PARAMS", BASE, 20, 16),
    u(0x1b, "UVM_REGISTER_CHANNEL_PARAMS", BASE, 56, 48),
    u(0x1c, "UVM_UNREGISTER_CHANNEL_PARAMS", BASE, 28, 24),
    u(
        0x1c,
        "UVM_UNREGISTER_CHANNEL_PARAMS_V590",
        "590.44.01",
        12,
        8,
    ),
    u(0x1d, "UVM_ENABLE_PEER_ACCESS_PARAMS", BASE, 36, 32),
    u(0x1e, "UVM_DISABLE_PEER_ACCESS_PARAMS", BASE, 36, 32),
    u(0x1f, "UVM_SET_RANGE_GROUP_PARAMS", BASE, 32, 24),
    u(0x21, "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", BASE, 1200, 1196),
    u(
        0x21,
        "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS_V550",
        "550.54.14",
        9264,
        9260,
    ),
    u(0x22, "UVM_FREE_PARAMS", BASE, 24, 16),
    u(0x22, "UVM_FREE_PARAMS_V590", "590.44.01", 16, 8),
    u(0x25, "UVM_REGISTER_GPU_PARAMS", BASE, 40, 36),
    u(0x26, "UVM_UNREGISTER_GPU_PARAMS", BASE, 20, 16),
    u(0x27, "UVM_PAGEABLE_MEM_ACCESS_PARAMS", BASE, 8, 4),
    u(0x2a, "UVM_SET_PREFERRED_LOCATION_PARAMS", BASE, 40, 32),
    u(
        0x2a,
        "UVM_SET_PREFERRED_LOCATION_PARAMS_V550",
        "550.40.07",
        40,
        36,
    ),
    u(0x2b, "UVM_UNSET_PREFERRED_LOCATION_PARAMS", BASE, 24, 16),
    u(0x2c, "UVM_ENABLE_READ_DUPLICATION_PARAMS", BASE, 24, 16),
    u(0x2d, "UVM_DISABLE_READ_DUPLICATION_PARAMS", BASE, 24, 16),
    u(0x2e, "UVM_SET_ACCESSED_BY_PARAMS", BASE, 40, 32),
    u(0x2f, "UVM_UNSET_ACCESSED_BY_PARAMS", BASE, 40, 32),
    u(0x33, "UVM_MIGRATE_PARAMS", BASE, 80, 72),
    u(0x33, "UVM_MIGRATE_PARAMS_V550", "550.40.07", 80, 72),
    u(0x35, "UVM_MIGRATE_RANGE_GROUP_PARAMS", BASE, 32, 24),
    u(0x3e, "UVM_TOOLS_READ_PROCESS_MEMORY_PARAMS", BASE, 40, 32),
    u(0x3f, "UVM_TOOLS_WRITE_PROCESS_MEMORY_PARAMS", BASE, 40, 32),
    u(
        0x41,
        "UVM_MAP_DYNAMIC_PARALLELISM_REGION_PARAMS",
        BASE,
        40,
        32,
    ),
    u(0x42, "UVM_UNMAP_EXTERNAL_PARAMS", BASE, 40, 32),
    u(0x44, "UVM_ALLOC_SEMAPHORE_POOL_PARAMS", BASE, 1184, 1176),
    u(
        0x44,
        "UVM_ALLOC_SEMAPHORE_POOL_PARAMS_V550",
        "550.54.14",
        9248,
        9240,
    ),
    u(0x46, "UVM_PAGEABLE_MEM_ACCESS_ON_GPU_PARAMS", BASE, 24, 20),
    u(0x48, "UVM_VALIDATE_VA_RANGE_PARAMS", BASE, 24, 16),
    u(0x49, "UVM_CREATE_EXTERNAL_RANGE_PARAMS", BASE, 24, 16),
    u(0x4b, "UVM_MM_INITIALIZE_PARAMS", BASE, 8, 4),
    r(0x27, "IoctlNVOS02ParametersWithFD", BASE, 56, Some(40)),
    r(0x29, "NVOS00_PARAMETERS", BASE, 16, Some(12)),
    r(0x2a, "NVOS54_PARAMETERS", BASE, 32, Some(28)),
    G {
        slot: "NVOS21",
        ..r(0x2b, "NVOS21_PARAMETERS", BASE, 32, Some(28))
    },
    G {
        slot: "NVOS64",
        ..r(0x2b, "NVOS64_PARAMETERS", BASE, 48, Some(40))
    },
    r(0x34, "NVOS55_PARAMETERS", BASE, 28, Some(24)),
    r(0x35, "NVOS57_PARAMETERS", BASE, 24, Some(20)),
    r(0x41, "NVOS30_PARAMETERS", BASE, 56, Some(48)),
    r(0x4a, "NVOS32_PARAMETERS", BASE, 184, Some(20)),
    r(0x4e, "IoctlNVOS33ParametersWithFD", BASE, 56, Some(40)),
    r(0x4f, "NVOS34_PARAMETERS", BASE, 32, Some(24)),
    r(0x54, "NVOS39_PARAMETERS", BASE, 56, Some(48)),
    r(0x57, "NVOS46_PARAMETERS", BASE, 56, Some(48)),
    r(0x57, "NVOS46_PARAMETERS_V580", "580.65.06", 64, Some(56)),
    r(0x58, "NVOS47_PARAMETERS", BASE, 40, Some(32)),
    r(0x58, "NVOS47_PARAMETERS_V550", "550.40.07", 48, Some(40)),
    r(0x5e, "NVOS56_PARAMETERS", BASE, 40, Some(32)),
    r(0xc8, "IoctlCardInfo", BASE, 72, None),
    r(0xc9, "IoctlRegisterFD", BASE, 4, None),
    r(0xce, "IoctlAllocOSEvent", BASE, 16, Some(12)),
    r(0xcf, "IoctlFreeOSEvent", BASE, 16, Some(12)),
    r(0xd2, "RMAPIVersion", BASE, 72, None),
    r(0xd6, "IoctlSysParams", BASE, 8, None),
    r(0xd9, "IoctlExportToDMABufFD", BASE, 2600, Some(2592)),
    r(
        0xd9,
        "IoctlExportToDMABufFD_V570",
        "570.86.15",
        2608,
        Some(2600),
    ),
    r(
        0xd9,
        "IoctlExportToDMABufFD_V580",
        "580.65.06",
        2608,
        Some(2600),
    ),
    r(0xda, "IoctlWaitOpenComplete", "550.40.07", 8, Some(4)),
];

/// `version.go`: "UVM range groups were removed in 610.43.02" (create, destroy, set,
/// migrate).
pub const RANGE_GROUPS_REMOVED_IN: &str = "610.43.02";
pub const RANGE_GROUP_COMMANDS: [u32; 4] = [0x17, 0x18, 0x1f, 0x35];

fn ver(s: &str) -> DriverVersion {
    s.parse().unwrap()
}

/// The struct gVisor uses for each command and slot at `at`.
fn in_effect(at: &DriverVersion) -> Vec<&'static G> {
    let mut by: std::collections::BTreeMap<(bool, u32, &str), &G> = Default::default();
    for g in STRUCTS.iter().filter(|g| ver(g.since) <= *at) {
        let slot = by.entry((g.uvm, g.cmd, g.slot)).or_insert(g);
        if ver(slot.since) <= ver(g.since) {
            *slot = g;
        }
    }
    by.into_values().collect()
}

#[test]
fn gvisor_agrees() {
    let mut checked = 0;
    let mut unchecked = Vec::new();
    let mut disagree = Vec::new();
    for s in VERSIONS {
        let at = ver(s);
        let l = layout_for(Some(&at));
        if !l.is_exact() {
            unchecked.push(*s);
            continue;
        }
        for g in in_effect(&at) {
            checked += 1;
            let want = (g.size, g.status);
            let ours: Vec<(u32, Option<u32>)> = if g.uvm {
                l.uvm_entry(g.cmd)
                    .map(|e| (e.params_size, e.status_offset))
                    .into_iter()
                    .collect()
            } else {
                l.rm_entries(g.cmd as u8)
                    .map(|e| (e.params_size, e.status_offset))
                    .collect()
            };
            if !ours.contains(&want) {
                disagree.push(format!(
                    "{s} {:#x} {}: gVisor {want:?}, table {ours:?}",
                    g.cmd, g.gvisor
                ));
            }
        }
    }
    eprintln!(
        "gVisor cross-check: {checked} (version, struct) pairs at {} versions; not tags here: {}",
        VERSIONS.len() - unchecked.len(),
        unchecked.join(" ")
    );
    assert!(checked > 1000, "only {checked} pairs checked");
    assert!(disagree.is_empty(), "{}", disagree.join("\n"));
}

/// gVisor's 610 fact, where the table can check it: the range-group commands are there up
/// to the newest tag before 610 and, once the table has 610 tags, gone from them.
#[test]
fn range_groups_until_610() {
    let cut = ver(RANGE_GROUPS_REMOVED_IN);
    for t in known_tags() {
        let l = layout_for(Some(t));
        for cmd in RANGE_GROUP_COMMANDS {
            assert_eq!(
                l.uvm_entry(cmd).is_some(),
                *t < cut,
                "{t}: {:?}",
                uvm_name(cmd)
            );
        }
    }
}
