//! NVIDIA and CUDA names: ioctl requests, ioctl result labels, `NV_STATUS` and `CUresult`
//! names. Params layouts (sizes, status offsets) are per driver version, in [`layouts`].
//!
//! Sources (NVIDIA open-gpu-kernel-modules, tag 590.48.01, unless noted):
//! * UVM commands and RM escapes: every name the headers of any release tag define
//!   (`kernel-open/nvidia-uvm/uvm_ioctl.h`, `uvm_linux_ioctl.h`;
//!   `src/nvidia/arch/nvalloc/unix/include/nv_escape.h`, `nv-ioctl-numbers.h`), through the
//!   generated table of [`layouts`];
//! * `NV_STATUS` values: `src/common/sdk/nvidia/inc/nvstatuscodes.h`;
//! * `CUresult` values: CUDA driver API `cuda.h` (CUDA 12/13).
//!
//! A command number keeps its name across driver versions (UVM only adds or removes
//! commands; the one RM escape renamed, 0x5f, gets its newest name), so names do not depend
//! on the driver version, unlike the layouts.

use uvmwatch_common::{node, result};

use super::layouts;
pub use super::layouts::NV_IOCTL_MAGIC;

/// RM escapes that no header of the open modules defines, with where the name comes from.
const EXTRA_RM_ESCAPES: &[(u8, &str)] = &[
    // `NV_IOCTL_BASE + 2`, with `nv_ioctl_env_info_t { NvU32 pat_supported; }`, in NVIDIA's
    // proprietary-driver `nv.h` (copyright 1999-2017) and in envytools; the open modules
    // list it only in `src/nvidia/generated/rmconfig.h` (`RMCFG_API_NV_ESC_ENV_INFO`, 515 to
    // 555) and dispatch it nowhere (such a call fails with EINVAL).
    (0xca, "NV_ESC_ENV_INFO"),
];

/// The name of the UVM command with this number (in any known driver), if any.
pub fn uvm_ioctl(cmd: u32) -> Option<&'static str> {
    layouts::uvm_name(cmd)
}

/// Every request [`ioctl_name`] can name, as the kernel side's `NAMED_CMDS` keys them:
/// (`true`, UVM request number) and (`false`, RM escape `_IOC_NR`).
pub fn named_requests() -> impl Iterator<Item = (bool, u32)> {
    layouts::named_uvm_cmds().map(|c| (true, c)).chain(
        (0..=255u8)
            .filter(|nr| rm_escape(*nr).is_some())
            .map(|nr| (false, nr as u32)),
    )
}

/// The name of the RM escape with this `_IOC_NR`, if any.
pub fn rm_escape(nr: u8) -> Option<&'static str> {
    layouts::rm_name(nr).or_else(|| {
        EXTRA_RM_ESCAPES
            .iter()
            .find(|(n, _)| *n == nr)
            .map(|(_, s)| *s)
    })
}

/// `_IOC_TYPE` of an `_IOC`-encoded request (`include/uapi/asm-generic/ioctl.h`).
pub fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}

/// `_IOC_NR` of an `_IOC`-encoded request.
pub fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}

/// Name of an ioctl request on a node of kind `node_kind`, or `None` when unknown.
///
/// UVM nodes take UVM command numbers; `nvidiactl` and GPU nodes take RM escapes, named by
/// `_IOC_NR` alone: the driver (`nvidia_ioctl` in `kernel-open/nvidia/nv.c`) dispatches on
/// `_IOC_NR` and `_IOC_SIZE` and ignores the type byte and the direction, so any request
/// with an escape's number is that escape.
pub fn ioctl_name(node_kind: u8, cmd: u32) -> Option<&'static str> {
    if node::is_uvm(node_kind) {
        return uvm_ioctl(cmd);
    }
    if node_kind == node::INVALID_FD {
        // No node says which numbering the caller meant: a UVM number first (the real case is
        // `UVM_DEINITIALIZE` after a failed `/dev/nvidia-uvm` open), then an RM escape.
        if let Some(name) = uvm_ioctl(cmd) {
            return Some(name);
        }
        // Nor which driver: only a request NVIDIA's user space would send ('F') is an RM
        // escape here (SIOCGIFHWADDR, 0x8927, is not NV_ESC_RM_ALLOC_MEMORY).
        if ioc_type(cmd) != NV_IOCTL_MAGIC {
            return None;
        }
    }
    rm_escape(ioc_nr(cmd) as u8)
}

/// Metric/label form of an ioctl: its name, or `unknown` (keeps label values bounded).
pub fn ioctl_label(node_kind: u8, cmd: u32) -> &'static str {
    ioctl_name(node_kind, cmd).unwrap_or("unknown")
}

/// Human form: the name, or the request number in hex.
pub fn ioctl_display(node_kind: u8, cmd: u32) -> String {
    match ioctl_name(node_kind, cmd) {
        Some(n) => n.to_string(),
        None => format!("{cmd:#x}"),
    }
}

/// Every `NV_STATUS` error code and the first warnings (`src/common/sdk/nvidia/inc/nvstatuscodes.h`).
const NV_STATUS_NAMES: &[(u32, &str)] = &[
    (0x0, "NV_OK"),
    (0xffff, "NV_ERR_GENERIC"),
    (0x1, "NV_ERR_BROKEN_FB"),
    (0x2, "NV_ERR_BUFFER_TOO_SMALL"),
    (0x3, "NV_ERR_BUSY_RETRY"),
    (0x4, "NV_ERR_CALLBACK_NOT_SCHEDULED"),
    (0x5, "NV_ERR_CARD_NOT_PRESENT"),
    (0x6, "NV_ERR_CYCLE_DETECTED"),
    (0x7, "NV_ERR_DMA_IN_USE"),
    (0x8, "NV_ERR_DMA_MEM_NOT_LOCKED"),
    (0x9, "NV_ERR_DMA_MEM_NOT_UNLOCKED"),
    (0xa, "NV_ERR_DUAL_LINK_INUSE"),
    (0xb, "NV_ERR_ECC_ERROR"),
    (0xc, "NV_ERR_FIFO_BAD_ACCESS"),
    (0xd, "NV_ERR_FREQ_NOT_SUPPORTED"),
    (0xe, "NV_ERR_GPU_DMA_NOT_INITIALIZED"),
    (0xf, "NV_ERR_GPU_IS_LOST"),
    (0x10, "NV_ERR_GPU_IN_FULLCHIP_RESET"),
    (0x11, "NV_ERR_GPU_NOT_FULL_POWER"),
    (0x12, "NV_ERR_GPU_UUID_NOT_FOUND"),
    (0x13, "NV_ERR_HOT_SWITCH"),
    (0x14, "NV_ERR_I2C_ERROR"),
    (0x15, "NV_ERR_I2C_SPEED_TOO_HIGH"),
    (0x16, "NV_ERR_ILLEGAL_ACTION"),
    (0x17, "NV_ERR_IN_USE"),
    (0x18, "NV_ERR_INFLATE_COMPRESSED_DATA_FAILED"),
    (0x19, "NV_ERR_INSERT_DUPLICATE_NAME"),
    (0x1a, "NV_ERR_INSUFFICIENT_RESOURCES"),
    (0x1b, "NV_ERR_INSUFFICIENT_PERMISSIONS"),
    (0x1c, "NV_ERR_INSUFFICIENT_POWER"),
    (0x1d, "NV_ERR_INVALID_ACCESS_TYPE"),
    (0x1e, "NV_ERR_INVALID_ADDRESS"),
    (0x1f, "NV_ERR_INVALID_ARGUMENT"),
    (0x20, "NV_ERR_INVALID_BASE"),
    (0x21, "NV_ERR_INVALID_CHANNEL"),
    (0x22, "NV_ERR_INVALID_CLASS"),
    (0x23, "NV_ERR_INVALID_CLIENT"),
    (0x24, "NV_ERR_INVALID_COMMAND"),
    (0x25, "NV_ERR_INVALID_DATA"),
    (0x26, "NV_ERR_INVALID_DEVICE"),
    (0x27, "NV_ERR_INVALID_DMA_SPECIFIER"),
    (0x28, "NV_ERR_INVALID_EVENT"),
    (0x29, "NV_ERR_INVALID_FLAGS"),
    (0x2a, "NV_ERR_INVALID_FUNCTION"),
    (0x2b, "NV_ERR_INVALID_HEAP"),
    (0x2c, "NV_ERR_INVALID_INDEX"),
    (0x2d, "NV_ERR_INVALID_IRQ_LEVEL"),
    (0x2e, "NV_ERR_INVALID_LIMIT"),
    (0x2f, "NV_ERR_INVALID_LOCK_STATE"),
    (0x30, "NV_ERR_INVALID_METHOD"),
    (0x31, "NV_ERR_INVALID_OBJECT"),
    (0x32, "NV_ERR_INVALID_OBJECT_BUFFER"),
    (0x33, "NV_ERR_INVALID_OBJECT_HANDLE"),
    (0x34, "NV_ERR_INVALID_OBJECT_NEW"),
    (0x35, "NV_ERR_INVALID_OBJECT_OLD"),
    (0x36, "NV_ERR_INVALID_OBJECT_PARENT"),
    (0x37, "NV_ERR_INVALID_OFFSET"),
    (0x38, "NV_ERR_INVALID_OPERATION"),
    (0x39, "NV_ERR_INVALID_OWNER"),
    (0x3a, "NV_ERR_INVALID_PARAM_STRUCT"),
    (0x3b, "NV_ERR_INVALID_PARAMETER"),
    (0x3c, "NV_ERR_INVALID_PATH"),
    (0x3d, "NV_ERR_INVALID_POINTER"),
    (0x3e, "NV_ERR_INVALID_REGISTRY_KEY"),
    (0x3f, "NV_ERR_INVALID_REQUEST"),
    (0x40, "NV_ERR_INVALID_STATE"),
    (0x41, "NV_ERR_INVALID_STRING_LENGTH"),
    (0x42, "NV_ERR_INVALID_READ"),
    (0x43, "NV_ERR_INVALID_WRITE"),
    (0x44, "NV_ERR_INVALID_XLATE"),
    (0x45, "NV_ERR_IRQ_NOT_FIRING"),
    (0x46, "NV_ERR_IRQ_EDGE_TRIGGERED"),
    (0x47, "NV_ERR_MEMORY_TRAINING_FAILED"),
    (0x48, "NV_ERR_MISMATCHED_SLAVE"),
    (0x49, "NV_ERR_MISMATCHED_TARGET"),
    (0x4a, "NV_ERR_MISSING_TABLE_ENTRY"),
    (0x4b, "NV_ERR_MODULE_LOAD_FAILED"),
    (0x4c, "NV_ERR_MORE_DATA_AVAILABLE"),
    (0x4d, "NV_ERR_MORE_PROCESSING_REQUIRED"),
    (0x4e, "NV_ERR_MULTIPLE_MEMORY_TYPES"),
    (0x4f, "NV_ERR_NO_FREE_FIFOS"),
    (0x50, "NV_ERR_NO_INTR_PENDING"),
    (0x51, "NV_ERR_NO_MEMORY"),
    (0x52, "NV_ERR_NO_SUCH_DOMAIN"),
    (0x53, "NV_ERR_NO_VALID_PATH"),
    (0x54, "NV_ERR_NOT_COMPATIBLE"),
    (0x55, "NV_ERR_NOT_READY"),
    (0x56, "NV_ERR_NOT_SUPPORTED"),
    (0x57, "NV_ERR_OBJECT_NOT_FOUND"),
    (0x58, "NV_ERR_OBJECT_TYPE_MISMATCH"),
    (0x59, "NV_ERR_OPERATING_SYSTEM"),
    (0x5a, "NV_ERR_OTHER_DEVICE_FOUND"),
    (0x5b, "NV_ERR_OUT_OF_RANGE"),
    (0x5c, "NV_ERR_OVERLAPPING_UVM_COMMIT"),
    (0x5d, "NV_ERR_PAGE_TABLE_NOT_AVAIL"),
    (0x5e, "NV_ERR_PID_NOT_FOUND"),
    (0x5f, "NV_ERR_PROTECTION_FAULT"),
    (0x60, "NV_ERR_RC_ERROR"),
    (0x61, "NV_ERR_REJECTED_VBIOS"),
    (0x62, "NV_ERR_RESET_REQUIRED"),
    (0x63, "NV_ERR_STATE_IN_USE"),
    (0x64, "NV_ERR_SIGNAL_PENDING"),
    (0x65, "NV_ERR_TIMEOUT"),
    (0x66, "NV_ERR_TIMEOUT_RETRY"),
    (0x67, "NV_ERR_TOO_MANY_PRIMARIES"),
    (0x68, "NV_ERR_UVM_ADDRESS_IN_USE"),
    (0x69, "NV_ERR_MAX_SESSION_LIMIT_REACHED"),
    (0x6a, "NV_ERR_LIB_RM_VERSION_MISMATCH"),
    (0x6b, "NV_ERR_PRIV_SEC_VIOLATION"),
    (0x6c, "NV_ERR_GPU_IN_DEBUG_MODE"),
    (0x6d, "NV_ERR_FEATURE_NOT_ENABLED"),
    (0x6e, "NV_ERR_RESOURCE_LOST"),
    (0x6f, "NV_ERR_PMU_NOT_READY"),
    (0x70, "NV_ERR_FLCN_ERROR"),
    (0x71, "NV_ERR_FATAL_ERROR"),
    (0x72, "NV_ERR_MEMORY_ERROR"),
    (0x73, "NV_ERR_INVALID_LICENSE"),
    (0x74, "NV_ERR_NVLINK_INIT_ERROR"),
    (0x75, "NV_ERR_NVLINK_MINION_ERROR"),
    (0x76, "NV_ERR_NVLINK_CLOCK_ERROR"),
    (0x77, "NV_ERR_NVLINK_TRAINING_ERROR"),
    (0x78, "NV_ERR_NVLINK_CONFIGURATION_ERROR"),
    (0x79, "NV_ERR_RISCV_ERROR"),
    (0x7a, "NV_ERR_FABRIC_MANAGER_NOT_PRESENT"),
    (0x7b, "NV_ERR_ALREADY_SIGNALLED"),
    (0x7c, "NV_ERR_QUEUE_TASK_SLOT_NOT_AVAILABLE"),
    (0x7d, "NV_ERR_KEY_ROTATION_IN_PROGRESS"),
    (0x7e, "NV_ERR_TEST_ONLY_CODE_NOT_ENABLED"),
    (0x7f, "NV_ERR_SECURE_BOOT_FAILED"),
    (0x80, "NV_ERR_INSUFFICIENT_ZBC_ENTRY"),
    (0x81, "NV_ERR_NVLINK_FABRIC_NOT_READY"),
    (0x82, "NV_ERR_NVLINK_FABRIC_FAILURE"),
    (0x83, "NV_ERR_GPU_MEMORY_ONLINING_FAILURE"),
    (0x84, "NV_ERR_REDUCTION_MANAGER_NOT_AVAILABLE"),
    (0x85, "NV_ERR_THRESHOLD_CROSSED"),
    (0x86, "NV_ERR_RESOURCE_RETIREMENT_ERROR"),
    (0x87, "NV_ERR_FABRIC_STATE_OUT_OF_SYNC"),
    (0x88, "NV_ERR_BUFFER_FULL"),
    (0x89, "NV_ERR_BUFFER_EMPTY"),
    (0x8a, "NV_ERR_MC_FLA_OFFSET_TABLE_FULL"),
    (0x10001, "NV_WARN_HOT_SWITCH"),
    (0x10002, "NV_WARN_INCORRECT_PERFMON_DATA"),
    (0x10003, "NV_WARN_MISMATCHED_SLAVE"),
    (0x10004, "NV_WARN_MISMATCHED_TARGET"),
    (0x10005, "NV_WARN_MORE_PROCESSING_REQUIRED"),
    (0x10006, "NV_WARN_NOTHING_TO_DO"),
    (0x10007, "NV_WARN_NULL_OBJECT"),
];

/// Name of an `NV_STATUS`, or `None` for a code not in the table.
pub fn nv_status_name(code: u32) -> Option<&'static str> {
    NV_STATUS_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
}

/// `NV_STATUS` as a label: its name or `NV_STATUS_0x<hex>`.
pub fn nv_status_label(code: u32) -> String {
    match nv_status_name(code) {
        Some(n) => n.to_string(),
        None => format!("NV_STATUS_{code:#x}"),
    }
}

/// The `result` label of an ioctl result (`uvmwatch_common::result` kind and code): `OK`, the
/// `NV_STATUS` label, the errno label, or `PARAMS_UNREADABLE`.
pub fn ioctl_result_label(kind: u8, code: u32) -> String {
    match kind {
        result::OK => "OK".into(),
        result::NV_STATUS => nv_status_label(code),
        result::ERRNO => crate::decode::errno::label(code),
        _ => "PARAMS_UNREADABLE".into(),
    }
}

/// `CUresult` names (`cuda.h`) for the codes CUDA start-up returns and their neighbours.
const CU_RESULTS: &[(i64, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (5, "CUDA_ERROR_PROFILER_DISABLED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// Name of a `CUresult`, or `CUDA_ERROR_<n>` for a code not in the table.
pub fn cu_result_name(code: i64) -> String {
    match CU_RESULTS.iter().find(|(c, _)| *c == code) {
        Some((_, n)) => n.to_string(),
        None => format!("CUDA_ERROR_{code}"),
    }
}

/// Label of a device node: `nvidiactl`, `nvidia<N>`, `nvidia-uvm`, `nvidia-uvm-tools`, or
/// `invalid_fd` ([`node::INVALID_FD`]).
pub fn node_label(kind: u8, minor: u8) -> String {
    match kind {
        node::CTL => "nvidiactl".into(),
        node::GPU => format!("nvidia{minor}"),
        node::UVM => "nvidia-uvm".into(),
        node::UVM_TOOLS => "nvidia-uvm-tools".into(),
        node::INVALID_FD => "invalid_fd".into(),
        _ => "unknown".into(),
    }
}

/// The device path of a node, e.g. `/dev/nvidia-uvm`; `invalid_fd` for a call on a negative
/// fd (no path at all).
pub fn node_path(kind: u8, minor: u8) -> String {
    match kind {
        node::INVALID_FD => node_label(kind, minor),
        _ => format!("/dev/{}", node_label(kind, minor)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uvm_names_do_not_depend_on_the_driver() {
        assert_eq!(uvm_ioctl(0x25), Some("UVM_REGISTER_GPU"));
        assert_eq!(uvm_ioctl(0x4b), Some("UVM_MM_INITIALIZE"));
        assert_eq!(uvm_ioctl(0x3000_0002), Some("UVM_DEINITIALIZE"));
        // Gone in 595, still named.
        assert_eq!(uvm_ioctl(0x36), Some("UVM_ENABLE_SYSTEM_WIDE_ATOMICS"));
        // Defined but never dispatched (the driver answers ENOSYS): named too.
        assert_eq!(uvm_ioctl(0x1), Some("UVM_RESERVE_VA"));
        assert_eq!(uvm_ioctl(0x7ff), Some("UVM_IS_8_SUPPORTED"));
        assert_eq!(uvm_ioctl(0x8), None);
        assert_eq!(uvm_ioctl(0x7777), None);
    }

    #[test]
    fn names_depend_on_node() {
        assert_eq!(ioctl_name(node::UVM, 0x25), Some("UVM_REGISTER_GPU"));
        assert_eq!(
            ioctl_name(node::UVM_TOOLS, 0x38),
            Some("UVM_TOOLS_INIT_EVENT_TRACKER")
        );
        assert_eq!(ioctl_name(node::CTL, 0x25), None);
        assert_eq!(
            ioctl_name(node::CTL, 0xC020_462A),
            Some("NV_ESC_RM_CONTROL")
        );
        assert_eq!(ioctl_name(node::GPU, 0xC048_46C8), Some("NV_ESC_CARD_INFO"));
        assert_eq!(
            ioctl_name(node::CTL, 0xC008_46DA),
            Some("NV_ESC_WAIT_OPEN_COMPLETE")
        );
        assert_eq!(ioctl_label(node::UVM, 0x7777), "unknown");
        assert_eq!(
            ioctl_name(node::INVALID_FD, 0x3000_0002),
            Some("UVM_DEINITIALIZE")
        );
        assert_eq!(node_path(node::INVALID_FD, 0), "invalid_fd");
        // No node on a negative fd: an RM escape only with NVIDIA's type byte.
        assert_eq!(
            ioctl_name(node::INVALID_FD, 0xC020_462A),
            Some("NV_ESC_RM_CONTROL")
        );
        assert_eq!(ioctl_name(node::INVALID_FD, 0x8927), None);
        assert_eq!(ioctl_name(node::INVALID_FD, 0x8004_5438), None);
        assert_eq!(ioctl_display(node::UVM, 0x7777), "0x7777");
    }

    #[test]
    fn rm_names_by_nr_whatever_the_type_byte() {
        // Every form of RM_ALLOC, and the same number with another type byte and direction:
        // nvidia_ioctl looks at _IOC_NR and _IOC_SIZE only.
        for cmd in [
            0xC020_462B,
            0xC028_462B,
            0xC030_462B,
            0x0030_002B,
            0x8030_542B,
        ] {
            assert_eq!(
                ioctl_name(node::CTL, cmd),
                Some("NV_ESC_RM_ALLOC"),
                "{cmd:#x}"
            );
        }
        // TCGETS on nvidiactl is _IOC_NR 1: no escape has it.
        assert_eq!(ioctl_name(node::CTL, 0x5401), None);
        // Names added: 0x5f (its 545+ name), 0xca (no header of the open modules).
        assert_eq!(rm_escape(0x5f), Some("NV_ESC_RM_LOCKLESS_DIAGNOSTIC"));
        assert_eq!(rm_escape(0xca), Some("NV_ESC_ENV_INFO"));
        assert_eq!(rm_escape(0xd7), Some("NV_ESC_NUMA_INFO"));
        assert_eq!(rm_escape(0xd8), Some("NV_ESC_SET_NUMA_STATUS"));
        assert_eq!(rm_escape(0x32), Some("NV_ESC_RM_CONFIG_GET"));
        assert_eq!(rm_escape(0x01), None);
        // Every number named before the table was generated still has its name.
        for (nr, name) in [
            (0x27, "NV_ESC_RM_ALLOC_MEMORY"),
            (0x28, "NV_ESC_RM_ALLOC_OBJECT"),
            (0x29, "NV_ESC_RM_FREE"),
            (0x34, "NV_ESC_RM_DUP_OBJECT"),
            (0x35, "NV_ESC_RM_SHARE"),
            (0x37, "NV_ESC_RM_CONFIG_GET_EX"),
            (0x38, "NV_ESC_RM_CONFIG_SET_EX"),
            (0x39, "NV_ESC_RM_I2C_ACCESS"),
            (0x41, "NV_ESC_RM_IDLE_CHANNELS"),
            (0x4a, "NV_ESC_RM_VID_HEAP_CONTROL"),
            (0x4d, "NV_ESC_RM_ACCESS_REGISTRY"),
            (0x4e, "NV_ESC_RM_MAP_MEMORY"),
            (0x4f, "NV_ESC_RM_UNMAP_MEMORY"),
            (0x52, "NV_ESC_RM_GET_EVENT_DATA"),
            (0x54, "NV_ESC_RM_ALLOC_CONTEXT_DMA2"),
            (0x56, "NV_ESC_RM_ADD_VBLANK_CALLBACK"),
            (0x57, "NV_ESC_RM_MAP_MEMORY_DMA"),
            (0x58, "NV_ESC_RM_UNMAP_MEMORY_DMA"),
            (0x59, "NV_ESC_RM_BIND_CONTEXT_DMA"),
            (0x5c, "NV_ESC_RM_EXPORT_OBJECT_TO_FD"),
            (0x5d, "NV_ESC_RM_IMPORT_OBJECT_FROM_FD"),
            (0x5e, "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO"),
            (200, "NV_ESC_CARD_INFO"),
            (201, "NV_ESC_REGISTER_FD"),
            (206, "NV_ESC_ALLOC_OS_EVENT"),
            (207, "NV_ESC_FREE_OS_EVENT"),
            (209, "NV_ESC_STATUS_CODE"),
            (210, "NV_ESC_CHECK_VERSION_STR"),
            (211, "NV_ESC_IOCTL_XFER_CMD"),
            (212, "NV_ESC_ATTACH_GPUS_TO_FD"),
            (213, "NV_ESC_QUERY_DEVICE_INTR"),
            (214, "NV_ESC_SYS_PARAMS"),
            (217, "NV_ESC_EXPORT_TO_DMABUF_FD"),
            (218, "NV_ESC_WAIT_OPEN_COMPLETE"),
        ] {
            assert_eq!(rm_escape(nr), Some(name), "{nr:#x}");
        }
    }

    #[test]
    fn result_labels() {
        assert_eq!(ioctl_result_label(result::NV_STATUS, 0), "NV_OK");
        assert_eq!(
            ioctl_result_label(result::NV_STATUS, 0x51),
            "NV_ERR_NO_MEMORY"
        );
        assert_eq!(ioctl_result_label(result::ERRNO, 11), "EAGAIN");
        assert_eq!(ioctl_result_label(result::OK, 0), "OK");
        assert_eq!(
            ioctl_result_label(result::UNREADABLE, 0),
            "PARAMS_UNREADABLE"
        );
    }

    #[test]
    fn status_and_result_names() {
        assert_eq!(nv_status_label(0), "NV_OK");
        assert_eq!(nv_status_label(0x51), "NV_ERR_NO_MEMORY");
        assert_eq!(nv_status_label(0x3), "NV_ERR_BUSY_RETRY");
        assert_eq!(nv_status_label(0x16), "NV_ERR_ILLEGAL_ACTION");
        assert_eq!(nv_status_label(0x1f), "NV_ERR_INVALID_ARGUMENT");
        assert_eq!(nv_status_label(0x65), "NV_ERR_TIMEOUT");
        assert_eq!(nv_status_label(0x10006), "NV_WARN_NOTHING_TO_DO");
        assert_eq!(nv_status_label(0xdead), "NV_STATUS_0xdead");
        assert_eq!(cu_result_name(3), "CUDA_ERROR_NOT_INITIALIZED");
        assert_eq!(cu_result_name(802), "CUDA_ERROR_SYSTEM_NOT_READY");
        assert_eq!(cu_result_name(12345), "CUDA_ERROR_12345");
        assert_eq!(crate::decode::errno::label(1), "EPERM");
        assert_eq!(crate::decode::errno::label(2), "ENOENT");
        assert_eq!(crate::decode::errno::label(4095), "E4095");
        assert_eq!(node_label(node::GPU, 3), "nvidia3");
        assert_eq!(node_path(node::UVM, 0), "/dev/nvidia-uvm");
    }
}
