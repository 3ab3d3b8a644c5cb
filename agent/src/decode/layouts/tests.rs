//! The generated table read back: versions, the choice of tag, the layout differences
//! between drivers that motivated per-version tables, and the invariants the kernel side
//! relies on.

use super::*;

fn v(s: &str) -> DriverVersion {
    s.parse().unwrap()
}

fn exact(s: &str) -> Layout {
    let l = layout_for(Some(&v(s)));
    assert!(l.is_exact(), "{s} is not a known tag (got {l})");
    l
}

/// (params size, status offset) of UVM command `cmd` at tag `tag`.
fn uvm(tag: &str, cmd: u32) -> Option<(u32, Option<u32>)> {
    exact(tag)
        .uvm_entry(cmd)
        .map(|e| (e.params_size, e.status_offset))
}

/// (params size, status offset) of every form of RM escape `nr` at `tag`, sorted.
fn rm(tag: &str, nr: u8) -> Vec<(u32, Option<u32>)> {
    let mut f: Vec<_> = exact(tag)
        .rm_entries(nr)
        .map(|e| (e.params_size, e.status_offset))
        .collect();
    f.sort();
    f
}

#[test]
fn table_parses() {
    let t = table::parse(TSV).unwrap();
    assert_eq!(t.tags[0].version, v("515.43.04"));
    assert!(t.tags.len() >= 193, "{} tags", t.tags.len());
    assert!(known_tags().any(|t| *t == v("595.45.04")));
    assert!(known_tags().any(|t| *t == v("535.98")));
}

#[test]
fn versions_parse_order_and_display() {
    for s in ["535.104.05", "535.98", "590.48.01", "550.100", "515.57"] {
        assert_eq!(v(s).to_string(), s);
    }
    assert_eq!(v(" 535.104.05\n"), DriverVersion::new(535, 104, Some(5)));
    assert_eq!(v("535.104.5").to_string(), "535.104.05");
    for bad in [
        "",
        "535",
        "535.",
        ".98",
        "535.98.01.1",
        "535.x",
        "v535.98",
        "-1.2",
        "535.98 beta",
    ] {
        assert!(bad.parse::<DriverVersion>().is_err(), "{bad:?}");
    }
    let err = "nope".parse::<DriverVersion>().unwrap_err().to_string();
    assert!(err.contains("MAJOR.MINOR"), "{err}");
    let mut all = [
        "590.48.01",
        "535.104.05",
        "535.98",
        "550.54.14",
        "535.43.02",
        "535.98.01",
    ]
    .map(v)
    .to_vec();
    all.sort();
    assert_eq!(
        all.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
        [
            "535.43.02",
            "535.98",
            "535.98.01",
            "535.104.05",
            "550.54.14",
            "590.48.01"
        ]
    );
}

#[test]
fn nearest_tag() {
    let pick = |s: &str| {
        let l = layout_for(Some(&v(s)));
        (l.tag().to_string(), l.selection())
    };
    let near = |t: &str| (t.to_string(), Selection::Nearest);
    assert_eq!(
        pick("535.104.05"),
        ("535.104.05".to_string(), Selection::Exact)
    );
    // Same branch, between or above its tags: the highest known at or below it.
    assert_eq!(pick("535.300.01"), near("535.288.01"));
    assert_eq!(pick("535.104.06"), near("535.104.05"));
    assert_eq!(pick("580.200"), near("580.142"));
    // Below every tag of its branch: the branch's first tag is closest.
    assert_eq!(pick("535.10"), near("535.43.02"));
    // An unknown branch: the closest by major; on a tie the older one.
    assert_eq!(pick("540.1"), near("535.288.01"));
    assert_eq!(pick("544.1"), near("545.23.06"));
    assert_eq!(pick("600.1"), near("595.45.04"));
    assert_eq!(pick("470.256.02"), near("515.43.04"));
    // No version: the newest.
    let l = layout_for(None);
    assert_eq!(
        (l.tag().to_string(), l.selection()),
        ("595.45.04".to_string(), Selection::Newest)
    );
    assert!(l.requested().is_none());
    assert_eq!(
        layout_for(Some(&v("535.300.01"))).to_string(),
        "535.288.01 (nearest known to 535.300.01)"
    );
    assert_eq!(exact("590.48.01").to_string(), "590.48.01");
    assert_eq!(exact("590.48.01").commit().len(), 40);
}

/// The differences between drivers, as the headers give them (see docs/compatibility.md).
#[test]
fn known_layout_differences() {
    const FREE: u32 = 0x22;
    const UNREGISTER_CHANNEL: u32 = 0x1c;
    const MAP_EXTERNAL_ALLOCATION: u32 = 0x21;
    const ALLOC_SEMAPHORE_POOL: u32 = 0x44;
    const SET_PREFERRED_LOCATION: u32 = 0x2a;
    const GET_PROCESSOR_UUID_TABLE: u32 = 0x40;
    const INIT_EVENT_TRACKER: u32 = 0x38;

    // UVM_FREE and UVM_UNREGISTER_CHANNEL shrank in 590.44.01.
    assert_eq!(uvm("535.104.05", FREE), Some((24, Some(16))));
    assert_eq!(uvm("580.142", FREE), Some((24, Some(16))));
    assert_eq!(uvm("590.44.01", FREE), Some((16, Some(8))));
    assert_eq!(uvm("590.48.01", FREE), Some((16, Some(8))));
    assert_eq!(uvm("580.142", UNREGISTER_CHANNEL), Some((28, Some(24))));
    assert_eq!(uvm("590.44.01", UNREGISTER_CHANNEL), Some((12, Some(8))));

    // UVM_MAX_GPUS grew from 32 to 256 in 550.40.53 (the first 550 release gVisor
    // supports with it is 550.54.14).
    assert_eq!(
        uvm("535.288.01", MAP_EXTERNAL_ALLOCATION),
        Some((1200, Some(1196)))
    );
    assert_eq!(
        uvm("550.40.07", MAP_EXTERNAL_ALLOCATION),
        Some((1200, Some(1196)))
    );
    assert_eq!(
        uvm("550.40.53", MAP_EXTERNAL_ALLOCATION),
        Some((9264, Some(9260)))
    );
    assert_eq!(
        uvm("550.54.14", MAP_EXTERNAL_ALLOCATION),
        Some((9264, Some(9260)))
    );
    assert_eq!(
        uvm("550.40.07", ALLOC_SEMAPHORE_POOL),
        Some((1184, Some(1176)))
    );
    assert_eq!(
        uvm("550.54.14", ALLOC_SEMAPHORE_POOL),
        Some((9248, Some(9240)))
    );

    // UVM_SET_PREFERRED_LOCATION got preferredCpuNumaNode in 550.
    assert_eq!(
        uvm("535.104.05", SET_PREFERRED_LOCATION),
        Some((40, Some(32)))
    );
    assert_eq!(
        uvm("545.29.06", SET_PREFERRED_LOCATION),
        Some((40, Some(32)))
    );
    assert_eq!(
        uvm("550.40.07", SET_PREFERRED_LOCATION),
        Some((40, Some(36)))
    );

    // The tools' UUID table and event tracker changed three times.
    for t in ["535.288.01", "550.54.14", "555.58.02", "560.35.03"] {
        assert_eq!(uvm(t, GET_PROCESSOR_UUID_TABLE).unwrap().1, Some(12), "{t}");
    }
    assert_eq!(
        uvm("565.57.01", GET_PROCESSOR_UUID_TABLE),
        Some((16, Some(8)))
    );
    assert_eq!(uvm("550.54.14", INIT_EVENT_TRACKER), Some((64, Some(48))));
    assert_eq!(uvm("560.28.03", INIT_EVENT_TRACKER), Some((56, Some(52))));
    assert_eq!(uvm("565.57.01", INIT_EVENT_TRACKER), Some((56, Some(48))));

    // Commands added and removed.
    assert_eq!(uvm("530.41.03", 0x4b), None);
    assert_eq!(uvm("535.43.02", 0x4b), Some((8, Some(4))));
    assert_eq!(uvm("590.48.01", 0x36), Some((20, Some(16))));
    assert_eq!(uvm("595.45.04", 0x36), None);
    assert_eq!(uvm("575.64.05", 0x50), None);
    assert_eq!(uvm("580.65.06", 0x50), Some((32, Some(24))));
    // Defined but never dispatched: not an entry.
    assert_eq!(uvm("590.48.01", 0x1), None);
    assert_eq!(uvm("590.48.01", 0x3000_0002), Some((0, None)));

    // NV_ESC_RM_ALLOC: NVOS21 (32 bytes) and NVOS64 (40, then 48 bytes).
    assert_eq!(rm("515.43.04", 0x2b), [(32, Some(24)), (40, Some(32))]);
    assert_eq!(rm("525.147.05", 0x2b), [(32, Some(24)), (40, Some(36))]);
    assert_eq!(rm("530.41.03", 0x2b), [(32, Some(24)), (40, Some(36))]);
    assert_eq!(rm("535.43.02", 0x2b), [(32, Some(28)), (48, Some(40))]);
    assert_eq!(rm("590.48.01", 0x2b), [(32, Some(28)), (48, Some(40))]);
    // NVOS47 (unmap DMA) grew in 550, NVOS46 (map DMA) in 580.
    assert_eq!(rm("545.29.06", 0x58), [(40, Some(32))]);
    assert_eq!(rm("550.40.07", 0x58), [(48, Some(40))]);
    assert_eq!(rm("575.64.05", 0x57), [(56, Some(48))]);
    assert_eq!(rm("580.65.06", 0x57), [(64, Some(56))]);
    // 0x5f: NV_ESC_RM_NVLOG_CTRL in 535, NV_ESC_RM_LOCKLESS_DIAGNOSTIC from 545.
    let name = |t: &str| exact(t).rm_entries(0x5f).map(|e| e.name).next();
    assert_eq!(name("535.43.02"), None);
    assert_eq!(name("535.104.05"), Some("NV_ESC_RM_NVLOG_CTRL"));
    assert_eq!(name("545.23.06"), Some("NV_ESC_RM_LOCKLESS_DIAGNOSTIC"));
    assert_eq!(rm("535.104.05", 0x5f), [(4024, Some(4))]);
    // NV_ESC_WAIT_OPEN_COMPLETE from 550.
    assert!(rm("545.29.06", 0xda).is_empty());
    assert_eq!(rm("550.40.07", 0xda), [(8, Some(4))]);
}

/// 590.48.01's table is the hand-written one it replaces (`kernel-open/nvidia-uvm/uvm_ioctl.h` at
/// tag 590.48.01, x86_64; the 590.48.01 rows of `nvidia-layouts.tsv`).
#[test]
fn tag_590_48_01_is_the_former_table() {
    let former: &[(u32, u32, u32)] = &[
        (0x3000_0001, 16, 8),
        (0x17, 16, 8),
        (0x18, 16, 8),
        (0x19, 32, 28),
        (0x1a, 20, 16),
        (0x1b, 56, 48),
        (0x1c, 12, 8),
        (0x1d, 36, 32),
        (0x1e, 36, 32),
        (0x1f, 32, 24),
        (0x21, 9264, 9260),
        (0x22, 16, 8),
        (0x25, 40, 36),
        (0x26, 20, 16),
        (0x27, 8, 4),
        (0x28, 272, 264),
        (0x29, 272, 264),
        (0x2a, 40, 36),
        (0x2b, 24, 16),
        (0x2c, 24, 16),
        (0x2d, 24, 16),
        (0x2e, 40, 32),
        (0x2f, 40, 32),
        (0x33, 80, 72),
        (0x35, 32, 24),
        (0x36, 20, 16),
        (0x37, 20, 16),
        (0x38, 56, 48),
        (0x39, 8, 4),
        (0x3a, 16, 8),
        (0x3b, 16, 8),
        (0x3c, 16, 8),
        (0x3d, 16, 8),
        (0x3e, 40, 32),
        (0x3f, 40, 32),
        (0x40, 16, 8),
        (0x41, 40, 32),
        (0x42, 40, 32),
        (0x43, 4, 0),
        (0x44, 9248, 9240),
        (0x45, 4, 0),
        (0x46, 24, 20),
        (0x47, 24, 20),
        (0x48, 24, 16),
        (0x49, 24, 16),
        (0x4a, 40, 32),
        (0x4b, 8, 4),
        (0x4c, 56, 48),
        (0x4d, 16, 8),
        (0x4e, 56, 52),
        (0x4f, 4, 0),
        (0x50, 32, 24),
    ];
    let l = exact("590.48.01");
    let mut got: Vec<(u32, u32, u32)> = l
        .uvm()
        .filter_map(|e| Some((e.cmd, e.params_size, e.status_offset?)))
        .collect();
    got.sort();
    let mut want = former.to_vec();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        l.uvm_entry(0x3000_0002).map(|e| e.status_offset),
        Some(None)
    );
    // The three RM escapes of the former table, by request number.
    let requests: Vec<(u32, u32)> = l
        .rm()
        .filter_map(|e| Some((e.request(), e.status_offset?)))
        .collect();
    for want in [(0xC020_462A, 28), (0xC030_462B, 40), (0xC010_4629, 12)] {
        assert!(requests.contains(&want), "{want:x?}");
    }
}

/// What `status_entries` / `Kernel::load_layout` (kernel/settings.rs) rely on, at every tag: a
/// status inside its params, RM sizes that fit `_IOC_SIZE` and give distinct requests, names
/// from the same table as `uvm_name`.
#[test]
fn every_tag_satisfies_the_kernel_invariants() {
    for t in known_tags() {
        let l = exact(&t.to_string());
        let mut keys = std::collections::BTreeSet::new();
        for e in l.uvm() {
            if let Some(off) = e.status_offset {
                assert!(off + 4 <= e.params_size, "{t} {}", e.name);
            }
            assert!(keys.insert((1, e.cmd)), "{t}: {} twice", e.name);
            assert_eq!(uvm_name(e.cmd), Some(e.name), "{t}");
        }
        for e in l.rm() {
            assert!(
                e.params_size > 0 && e.params_size <= table::IOC_SIZE_MAX,
                "{t} {}",
                e.name
            );
            if let Some(off) = e.status_offset {
                assert!(off + 4 <= e.params_size, "{t} {}", e.name);
            }
            let req = e.request();
            assert_eq!((req >> 16) & 0x3fff, e.params_size);
            assert_eq!(req & 0xff, e.nr as u32);
            assert_eq!((req >> 8) & 0xff, NV_IOCTL_MAGIC);
            assert!(keys.insert((0, req)), "{t}: {req:#x} twice");
        }
        assert!(keys.len() < 1024, "CMDS holds 1024 entries");
    }
}

#[test]
fn the_parser_refuses_what_the_kernel_cannot_use() {
    let head = format!("# tag\t535.43.02\t{}\n", "a".repeat(40));
    let with = |row: &str| -> &'static str { Box::leak(format!("{head}{row}\n").into_boxed_str()) };
    let ok = "uvm\t0x22\tUVM_FREE\t535.43.02\t535.43.02\t24\t16\trmStatus\tUVM_FREE_PARAMS\tuvm.c";
    assert!(table::parse(with(ok)).is_ok());
    for (bad, why) in [
        (ok.replace("\t24\t16\t", "\t24\t21\t"), "status outside params"),
        (ok.replace("535.43.02\t535.43.02", "535.43.02\t590.1"), "unknown tag"),
        (
            "rm\t0x2b\tNV_ESC_RM_ALLOC\t535.43.02\t535.43.02\t16384\t40\tstatus\tNVOS64_PARAMETERS\tescape.c".into(),
            "larger than _IOC_SIZE",
        ),
        (
            "rm\t0x12b\tNV_ESC_RM_ALLOC\t535.43.02\t535.43.02\t48\t40\tstatus\tNVOS64_PARAMETERS\tescape.c".into(),
            "not an _IOC_NR",
        ),
        (ok.replace("\trmStatus\tUVM_FREE_PARAMS", "\t-\t-"), "status without params"),
        (format!("{ok}\n{}", ok.replace("UVM_FREE", "UVM_OTHER").replace("UVM_OTHER_PARAMS", "UVM_FREE_PARAMS")), "two names"),
        (ok.replace("\tuvm.c", ""), "9 fields"),
    ] {
        assert!(table::parse(with(&bad)).is_err(), "{why}: accepted");
    }
    let unordered = format!(
        "# tag\t590.48.01\t{0}\n# tag\t535.43.02\t{0}\n",
        "a".repeat(40)
    );
    assert!(table::parse(Box::leak(unordered.into_boxed_str())).is_err());
}
